"""Pools of servers: the engine's FIFO pools, and gloo's worker threads as such a pool (a collective runs on
whichever of its rank's threads is free).

The engine's side (`PoolArrays`, `PoolQueues`, `take`, `give`): a node that acquires from a pool starts when one
of its servers is free, else it waits in the pool's FIFO queue; a node that releases gives its server to the
oldest waiting node, or back to the pool. Plain Python over numpy arrays and named tuples that numba compiles
inside the engine's loop.

The graph keeps each gloo collective on the runloop thread it ran on, after the one that thread ran before
(a `thread` edge): right for the measured run, wrong for a what-if, where a job that queued behind a slow
transfer would keep waiting for that same thread while the other one idles. Here each rank's runloop
threads of one process group (every ProcessGroupGloo has its own) become one pool with as many servers as
it has such threads: a job takes a server when its
work starts (the `gloo:*` annotation: the graph's `comm` node) and gives it back when the work ends (its
`comm_exit`); the thread edge into the job no longer binds, and the jobs are served in the order they
were enqueued (each after the previous one's start). A job that measured queued (its thread was
busy when the call enqueued it) keeps only its hand-off delay, not the queueing, as the lag of its enqueue
edge; one that did not keeps its measured wake-up.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from analyses import depgraph as _graph


class PoolArrays(NamedTuple):
    """Pools as the engine's loop takes them: acquire[node] / release[node], the pool the node takes a server of
    when it starts / gives one back to when it ends (-1: none); servers[p]; q_ptr[p]:q_ptr[p + 1], the slots of
    pool p's queue (one per node that acquires from it)."""

    acquire: np.ndarray
    release: np.ndarray
    servers: np.ndarray
    q_ptr: np.ndarray


def engine_pools(n: int, pools) -> PoolArrays:
    """The loop's PoolArrays from (acquire per node, release per node, servers per pool); None: no pools."""
    none = np.full(n, -1, np.int64)
    if pools is None:
        return PoolArrays(none, none, np.zeros(0, np.int64), np.zeros(1, np.int64))
    acquire, release = (np.ascontiguousarray(np.asarray(x, np.int64)) for x in pools[:2])
    servers = np.ascontiguousarray(np.asarray(pools[2], np.int64))
    for name, v in (("acquire", acquire), ("release", release)):
        if len(v) != n:
            raise ValueError(f"{len(v)} pool {name} entries for {n} nodes")
        if len(v) and (v.max() >= len(servers) or (v < -1).any()):
            raise ValueError(f"a node names a pool outside 0..{len(servers) - 1}")
    if (servers < 1).any():
        raise ValueError("every pool needs at least one server")
    if not np.array_equal(np.bincount(acquire[acquire >= 0], minlength=len(servers)),
                          np.bincount(release[release >= 0], minlength=len(servers))):
        raise ValueError("every pool must get back as many servers as it gives out")
    members = np.bincount(acquire[acquire >= 0], minlength=len(servers))
    q_ptr = np.zeros(len(servers) + 1, np.int64)
    np.cumsum(members, out=q_ptr[1:])
    return PoolArrays(acquire, release, servers, q_ptr)


class PoolQueues(NamedTuple):
    """During a replay: each pool's free servers, and its queue, a FIFO over its slots of `queue`."""

    free: np.ndarray
    queue: np.ndarray
    head: np.ndarray
    tail: np.ndarray


def pool_queues(pl: PoolArrays) -> PoolQueues:
    """Every server free, every queue empty."""
    return PoolQueues(pl.servers.copy(), np.zeros(max(pl.q_ptr[-1], 1), np.int64), pl.q_ptr[:-1].copy(),
                      pl.q_ptr[:-1].copy())


def take(q: PoolQueues, p, node) -> bool:
    """Node is ready and acquires from pool p: True when it got a server (it starts now), False when it queues."""
    if q.free[p] == 0:
        q.queue[q.tail[p]] = node
        q.tail[p] += 1
        return False
    q.free[p] -= 1
    return True


def give(q: PoolQueues, p) -> int:
    """A node gives pool p's server back: the oldest queued node, which gets it (starts now), or -1 (it is free)."""
    if q.head[p] < q.tail[p]:
        node = q.queue[q.head[p]]
        q.head[p] += 1
        return node
    q.free[p] += 1
    return -1


def gloo_pools(g, lag_ns: np.ndarray):
    """(edge sources, edge from_end flags, edge lags, (acquire, release, servers), pooled jobs) for the
    engine, or None when the graph has no gloo work on runloop threads."""
    on_cpu = np.zeros(g.n_nodes, bool)
    has = g.track >= 0
    on_cpu[has] = ~g.tracks.is_gpu.to_numpy(bool)[g.track[has]]
    comm = np.flatnonzero((g.kind == _graph.K["comm"]) & on_cpu)  # names are looked at for these only
    jobs = comm[np.array([str(n).startswith("gloo:") for n in g.name[comm]], bool)]
    if not len(jobs):
        return None
    acquire = np.full(g.n_nodes, -1, np.int64)
    release = np.full(g.n_nodes, -1, np.int64)
    # a pool per rank and process group: each ProcessGroupGloo has worker threads of its own
    pg_of = dict(zip(g.colls.coll_id.astype(int), g.colls.pg_name.astype(object)))
    key = [(int(r), str(pg_of.get(int(c)))) for r, c in zip(g.rank[jobs], g.coll[jobs])]
    pool_of_key = {k: i for i, k in enumerate(dict.fromkeys(key))}
    pool = np.array([pool_of_key[k] for k in key], np.int64)
    servers = np.array([len(np.unique(g.track[jobs[pool == i]])) for i in range(len(pool_of_key))], np.int64)
    acquire[jobs] = pool
    release[jobs + 1] = pool  # the job's comm_exit, spliced right after it on its track
    src, from_end, lag = g.src.copy(), g.from_end.copy(), lag_ns.copy()
    is_job = np.zeros(g.n_nodes, bool)
    is_job[jobs] = True
    start, dur = g.start_ns, g.dur_ns
    ready = np.where(g.from_end, start[g.src] + dur[g.src], start[g.src])
    thread_in = np.flatnonzero((g.edge_kind == _graph.E["thread"]) & is_job[g.dst])
    enqueue_in = np.flatnonzero((g.edge_kind == _graph.E["enqueue"]) & is_job[g.dst])
    # a job whose thread was still busy when it was enqueued measured queued: only the hand-off after its
    # thread's previous work stays as its lag
    thread_ready = np.full(g.n_nodes, np.iinfo(np.int64).min, np.int64)
    thread_ready[g.dst[thread_in]] = ready[thread_in]
    e = enqueue_in
    queued = thread_ready[g.dst[e]] > ready[e]
    lag[e[queued]] = np.maximum(start[g.dst[e[queued]]] - thread_ready[g.dst[e[queued]]], 0)
    # the thread edge into a job binds no more; in its place the job follows the rank's previous job in
    # enqueue order (from its start, no lag): the queue is first in, first out, so no job is served before
    # one enqueued earlier, whatever their hand-off delays (a 3.6 ms wake-up put a job behind two enqueued
    # after it, and the ranks, served in different orders, waited on each other for ever)
    has_enqueue = np.zeros(g.n_nodes, bool)
    has_enqueue[g.dst[e]] = True
    free = thread_in[has_enqueue[g.dst[thread_in]]]  # jobs without an enqueue edge keep their thread order
    enq_at = np.full(g.n_nodes, np.iinfo(np.int64).max, np.int64)
    enq_at[g.dst[e]] = ready[e]
    prev = np.zeros(g.n_nodes, np.int64)  # the origin for a rank's first job
    for i in range(len(pool_of_key)):
        mine = jobs[(pool == i) & has_enqueue[jobs]]
        mine = mine[np.lexsort((mine, enq_at[mine]))]
        prev[mine[1:]] = mine[:-1]
    src[free], from_end[free], lag[free] = prev[g.dst[free]], False, 0
    keep = has_enqueue[jobs]
    acquire[jobs[~keep]] = -1
    release[jobs[~keep] + 1] = -1
    return src, from_end, lag, (acquire, release, servers), int(keep.sum())
