"""The discrete-event core: one heap of (time, priority, sequence, event), nothing else.

Small on purpose (SimPy's core is the model): no wall clock, no randomness of its own (models draw
from a seeded generator before the run), ties broken by priority then by a counter, so a run is
bit-identical for the same inputs. The models plug in from outside: they decide each node's duration
and each dependency's lag (a collective's transfer is its barrier node's duration); the core only
orders events.

Events are a node's START (priority 1) and END (priority 0, so that at equal times everything that
ends is released before anything new starts). A node starts once every dependency has been released:
at the latest release time plus that dependency's lag. Dependencies are released at their source's
start (`from_end` false) or end.

Work served by a pool (a backend's worker threads: gloo runs collectives on whichever of its threads is
free) takes a server when it starts and gives it back when it (or a later node of the same job) ends: a
node that acquires from a pool starts at once when one of the pool's servers is free, else it waits in the
pool's FIFO queue and starts when a server is given back (servers given back at a time serve the work that
became ready at that time).

Transfers that share links are flows (replay/sharing.py): a flow node starts like any node, waits its
latency (an ACTIVATE event), then moves its bytes at the max-min fair rate its links give it; the rates of
all moving flows are recomputed at every activation and every end, and the earliest predicted end is a
CHECK event (stale ones, from before the latest recomputation, are skipped). Without flows the loop is the
plain one.

The loop is plain Python that numba compiles when it is installed (the same source either way); the
compiled core replays millions of nodes per second, the interpreted one a few hundred thousand.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

try:  # compiled when numba is available; the interpreted source is the reference
    from numba import njit as _njit
except ImportError:  # pragma: no cover - numba is a dependency, but keep working without it
    _njit = None

from .sharing import Flows, max_min_rates

START, END = 1, 0  # priorities: ENDs (and flow CHECKs) first at equal times; ACTIVATE ranks with START
_EPS_NS = 1e-6  # a predicted flow end this close above an integer ns is that ns (float noise, not time)

_max_min = _njit(cache=True, nogil=True)(max_min_rates) if _njit is not None else max_min_rates


def _simulate(n, dur, out_ptr, out_dst, out_lag, out_from_end, indeg, source, t0, until,
              flow_of, f_node, f_bytes, f_lat, f_ptr, f_links, f_cap, f_burst, pool_of, release_of, pool_servers,
              q_ptr):
    """Run the event loop. Returns (start, end) per node; -1 for nodes that never started (or started
    after `until` when until >= 0) and whose end lies past it. flow_of[node]: the node's flow (-1: none);
    f_*: the flows (replay/sharing.Flows); pool_of[node]: the pool the node takes a server of when it starts
    (-1: none), release_of[node]: the pool it gives a server back to when it ends, pool_servers[p] its
    servers, q_ptr[p]:q_ptr[p+1] the slots of its queue (one per node that acquires from it).

    Event codes: node (START; for a pool node: ready, served when a server is free), node + n (a flow's
    ACTIVATE), node + 2n (START of a pool node that holds a server), -(version + 1) (a flow CHECK)."""
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    ready = np.full(n, np.iinfo(np.int64).min, np.int64)
    waiting = indeg.copy()
    heap = [(np.int64(t0), np.int64(START), np.int64(0), np.int64(source))]
    seq = 1
    # flows: the moving ones (active[:n_active], pos[f] their slot), bytes left when the rates were last set
    n_flows = len(f_node)
    n_links = len(f_cap)
    active = np.zeros(n_flows, np.int64)
    pos = np.full(n_flows, -1, np.int64)
    left = f_bytes.copy()
    rate = np.zeros(n_flows, np.float64)
    pred_end = np.zeros(n_flows, np.int64)
    rem_cap = np.zeros(n_links, np.float64)
    n_on = np.zeros(n_links, np.int64)
    touched = np.zeros(n_links, np.int64)
    frozen = np.zeros(n_flows, np.bool_)
    # token buckets (f_burst[l] > 0): tokens held, flows crossing the link, since when it has been idle
    buckets = bool((f_burst > 0).any())
    tokens = f_burst.copy()
    crossing = np.zeros(n_links, np.int64)
    idle_since = np.full(n_links, t0, np.int64)
    n_active = 0
    t_rates = np.int64(t0)
    version = 0
    # pools: free servers, and each queue as a FIFO over its slots
    free = pool_servers.copy()
    queue = np.zeros(max(q_ptr[-1], 1), np.int64)
    q_head = q_ptr[:-1].copy()
    q_tail = q_ptr[:-1].copy()
    while len(heap) > 0:
        t, prio, _s, code = heapq.heappop(heap)
        if until >= 0 and t > until:
            break
        if code < 0 or (n <= code < 2 * n):  # a flow event: CHECK (code < 0) or ACTIVATE (code = node + n)
            if code < 0 and -code - 1 != version:
                continue  # the rates changed since this end was predicted
            dt = t - t_rates
            for i in range(n_active):
                f = active[i]
                if dt > 0 and rate[f] < np.inf:
                    left[f] = max(left[f] - rate[f] * dt, 0.0)
            if code < 0:  # the flows predicted to end now end; their nodes end with them
                i = 0
                while i < n_active:
                    f = active[i]
                    if pred_end[f] <= t:
                        heapq.heappush(heap, (t, np.int64(END), np.int64(seq), f_node[f]))
                        seq += 1
                        if buckets:
                            for k in range(f_ptr[f], f_ptr[f + 1]):
                                lk = f_links[k]
                                crossing[lk] -= 1
                                if crossing[lk] == 0:
                                    idle_since[lk] = t
                        n_active -= 1
                        last = active[n_active]
                        active[i] = last
                        pos[last] = i
                        pos[f] = -1
                    else:
                        i += 1
            else:
                f = flow_of[code - n]
                active[n_active] = f
                pos[f] = n_active
                n_active += 1
                if buckets:  # the tokens its bucketed links hold (the least) pass at once
                    passed = np.inf
                    for k in range(f_ptr[f], f_ptr[f + 1]):
                        lk = f_links[k]
                        if f_burst[lk] > 0:
                            if crossing[lk] == 0:
                                tokens[lk] = min(f_burst[lk], tokens[lk] + f_cap[lk] * (t - idle_since[lk]))
                            passed = min(passed, tokens[lk])
                    if passed < np.inf:
                        passed = min(passed, left[f])
                        left[f] -= passed
                        for k in range(f_ptr[f], f_ptr[f + 1]):
                            lk = f_links[k]
                            if f_burst[lk] > 0:
                                tokens[lk] -= passed
                    for k in range(f_ptr[f], f_ptr[f + 1]):
                        crossing[f_links[k]] += 1
            _max_min(active, n_active, f_ptr, f_links, f_cap, rate, rem_cap, n_on, frozen, touched)
            t_rates = t
            version += 1
            soonest = np.iinfo(np.int64).max
            for i in range(n_active):
                f = active[i]
                if rate[f] == np.inf or left[f] <= 0.0:
                    pred_end[f] = t
                else:
                    pred_end[f] = t + np.int64(np.ceil(left[f] / rate[f] - _EPS_NS))
                if pred_end[f] < soonest:
                    soonest = pred_end[f]
            if n_active > 0:
                heapq.heappush(heap, (soonest, np.int64(END), np.int64(seq), np.int64(-version - 1)))
                seq += 1
            continue
        node = code
        if prio == START and node >= 2 * n:  # a pool node that got its server
            node -= 2 * n
        elif prio == START and pool_of[node] >= 0:  # a pool node is ready: served now, or queued
            p = pool_of[node]
            if free[p] == 0:
                queue[q_tail[p]] = node
                q_tail[p] += 1
                continue
            free[p] -= 1
        if prio == START:
            start[node] = t
            point = 0
            f = flow_of[node]
            if f >= 0:  # moves once its latency has passed; its end comes from the sharing
                heapq.heappush(heap, (t + f_lat[f], np.int64(START), np.int64(seq), node + n))
            else:
                heapq.heappush(heap, (t + dur[node], np.int64(END), np.int64(seq), node))
            seq += 1
        else:
            end[node] = t
            point = 1
            p = release_of[node]
            if p >= 0:  # the server goes to the oldest waiting work of the pool, or becomes free
                if q_head[p] < q_tail[p]:
                    heapq.heappush(heap, (t, np.int64(START), np.int64(seq), queue[q_head[p]] + 2 * n))
                    seq += 1
                    q_head[p] += 1
                else:
                    free[p] += 1
        for k in range(out_ptr[node], out_ptr[node + 1]):
            if out_from_end[k] != point:
                continue
            d = out_dst[k]
            r = t + out_lag[k]
            if r > ready[d]:
                ready[d] = r
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(heap, (ready[d], np.int64(START), np.int64(seq), d))
                seq += 1
    return start, end


_compiled = None


def _core(compiled: bool):
    global _compiled
    if not compiled or _njit is None:
        return _simulate
    if _compiled is None:
        _compiled = _njit(cache=True, nogil=True)(_simulate)
    return _compiled


@dataclass
class Schedule:
    """When every node started and ended (ns on the trace clock; -1: not reached)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    events: int  # events processed (2 per node reached)


class Engine:
    """Replays a dependency graph: nodes with durations, edges with lags.

    `src`, `dst`, `from_end`, `lag_ns` are edge arrays; `dur_ns` per node; `source` is the one node
    without dependencies (the origin), started at `t0_ns`.
    """

    def __init__(self, n_nodes: int, src, dst, from_end, lag_ns, *, source: int = 0, t0_ns: int = 0,
                 compiled: bool = True):
        self.n = int(n_nodes)
        src = np.asarray(src, np.int64)
        # CSR by source; graphs from analyses.depgraph come sorted already (a check is cheaper than a sort)
        order = (np.arange(len(src)) if len(src) < 2 or bool((np.diff(src) >= 0).all())
                 else np.argsort(src, kind="stable"))
        self._dst = np.ascontiguousarray(np.asarray(dst, np.int64)[order])
        self._lag = np.ascontiguousarray(np.asarray(lag_ns, np.int64)[order])
        self._from_end = np.ascontiguousarray(np.asarray(from_end, bool)[order].astype(np.int8))
        self._order = order
        self._ptr = np.zeros(self.n + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=self.n), out=self._ptr[1:])
        self._indeg = np.bincount(self._dst, minlength=self.n).astype(np.int64)
        if (self._lag < 0).any():
            raise ValueError("negative lags would let time run backwards")
        roots = np.flatnonzero(self._indeg == 0)
        if len(roots) != 1 or roots[0] != source:
            raise ValueError(f"the graph must have exactly one node without dependencies (the origin, {source}); "
                             f"it has {len(roots)}")
        self.source, self.t0 = int(source), int(t0_ns)
        self.compiled = compiled

    def run(self, dur_ns, lag_ns=None, *, until: int = -1, flows: Flows | None = None,
            pools: tuple | None = None) -> Schedule:
        """Replay with these node durations (and edge lags, default: the constructor's). flows: transfers
        timed by link sharing (replay/sharing.Flows); their nodes' durations are not used. pools:
        (acquire per node, release per node, servers per pool): the pool each node takes a server of when
        it starts and the one it gives a server back to when it ends (-1: none), served in FIFO order."""
        dur = np.ascontiguousarray(np.asarray(dur_ns, np.int64))
        if len(dur) != self.n:
            raise ValueError(f"{len(dur)} durations for {self.n} nodes")
        if (dur < 0).any():
            raise ValueError("negative durations")
        lag = self._lag if lag_ns is None else np.ascontiguousarray(np.asarray(lag_ns, np.int64)[self._order])
        if (lag < 0).any():
            raise ValueError("negative lags would let time run backwards")
        fl = Flows.none() if flows is None else flows
        flow_of = np.full(self.n, -1, np.int64)
        if len(fl):
            if fl.node.min() < 0 or fl.node.max() >= self.n:
                raise ValueError(f"a flow names a node outside 0..{self.n - 1}")
            flow_of[fl.node] = np.arange(len(fl), dtype=np.int64)
        pool_of, release_of, servers, q_ptr = _pools(self.n, pools)
        start, end = _core(self.compiled)(self.n, dur, self._ptr, self._dst, lag, self._from_end, self._indeg,
                                          np.int64(self.source), np.int64(self.t0), np.int64(until), flow_of,
                                          fl.node, fl.bytes, fl.latency_ns, fl.route_ptr, fl.route_links,
                                          fl.capacity, fl.burst, pool_of, release_of, servers, q_ptr)
        reached = int((start >= 0).sum())
        if until < 0 and reached != self.n:
            raise ValueError(f"{self.n - reached} node(s) never became ready: the graph has a cycle")
        return Schedule(start, end, reached + int((end >= 0).sum()))


def _pools(n: int, pools):
    """(acquire, release, servers, queue pointers) for the loop from (acquire, release, servers)."""
    none = np.full(n, -1, np.int64)
    if pools is None:
        return none, none, np.zeros(0, np.int64), np.zeros(1, np.int64)
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
    return acquire, release, servers, q_ptr
