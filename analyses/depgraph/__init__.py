"""The dependency graph of a run: what waited for what, on every rank, rebuilt from a store.

Nodes (`Graph.kind`):
  origin      time zero of the replay (the earliest measured start); every track's first node hangs off it
  cpu         a piece of CPU work on one thread: top-level ops cut at every runtime call, collective call
              and collective annotation inside them, so that each piece is plain CPU time
  runtime     a CUDA/HIP runtime or driver call (launches, event records, ...)
  sync        a synchronising call (stream/device/event synchronize, blocking memcpy): its entry; the
              `sync_exit` node after it is where it returns, once the GPU work it waited for is done
  gpu         a kernel, memcpy or memset on a stream
  comm        a collective's participant on one rank (NCCL kernel, gloo runloop annotation): its arrival;
              the `comm_exit` node after it is where the collective finished on that rank. gloo's send and recv
              run on the caller's transport while the thread runs on: their pair sits on no track, timed by
              the gloo:send / gloo:recv annotation that outlasts the call
  barrier     one collective instance across ranks: it starts when the last participant has arrived and
              lasts the transfer time (the communication model's; measured by default)

Edges (`Graph.edge_kind`), each from a node's start or end to another node's start:
  origin      origin -> each track's first node
  thread      program order on a CPU thread;   stream   FIFO order on a GPU stream
  launch      launch call start -> GPU op start (correlation)
  event_wait  cudaEventRecord on one stream -> cudaStreamWaitEvent on another: the op launched before the
              record -> the first op launched on the waiting stream after the wait
  sync        the last GPU op a synchronising call waited for -> its return
  enqueue     gloo collective call -> the runloop thread's work on it
  host_wait   the end of a gloo collective -> the caller's next op, when the calling thread sat idle while
              the collective finished (it blocked in work.wait(), in wait_tensor, or inside the region that
              waits: FSDP's all-gather, an autograd node's hook): that wait is left out of the thread's pieces
  arrive      participant arrival -> barrier;   release  barrier end -> each participant's exit
  posted      a lane-less participant's arrival -> its exit
  pair_order  barrier end -> barrier start: a gloo send / recv whose receiver's ready notice queued behind the
              other way's message on the pair's TCP stream (collectives._behind_on_the_pair)

Every node keeps its measured duration. The time between a node becoming ready (its last dependency
met, on the measured times) and its measured start is kept as the `lag_ns` of that binding dependency:
CPU gaps between ops, launch latency, GPU scheduling gaps, wake-up after a sync. Other dependencies get
lag 0. A replay with measured durations, lags and transfers therefore reproduces the measured run when
the graph holds no false dependency; a what-if changes durations and transfers and lets the
dependencies decide what moves. Inferred dependencies (event_wait, sync, enqueue, host_wait) that the
measurements contradict are dropped and counted in `notes`.

The package builds it by job: load (the store's rows), tracks (nodes per thread and stream), collectives
(instances across ranks), edges (dependencies between tracks), lags (binding dependencies); model holds
the arrays, the kinds and the builder. Replay and the critical path both read this one graph.
"""
from __future__ import annotations

import numpy as np

from tracekit.errors import TracekitError

from .collectives import collectives, waits_by_track
from .edges import collective_edges, gpu_edges, laneless_participants
from .lags import bind_lags
from .load import Loaded, load, select_ranks
from .model import EDGE_KINDS, KINDS, SYNC_CALLS, WAIT_CALLS, Builder, E, Graph, K, NodeMap
from .tracks import add_roles, add_tracks, track_table, working_spans
from .wide import RunWide, rank_shapes, run_wide

__all__ = ["E", "EDGE_KINDS", "Graph", "K", "KINDS", "RunWide", "SYNC_CALLS", "WAIT_CALLS", "build", "rank_shapes",
           "run_wide"]


def build(run, ranks=None, wide: RunWide | None = None) -> Graph:
    """The dependency graph of the run's ranks (default: all of them). wide (run_wide's): the collective instances,
    the origin and the steps are every rank's, so that the given ranks' nodes, edges and lags are those the graph of
    every rank gives them; a barrier waits only on the given ranks' arrivals (the others' are the folding's to add:
    replay/fold.py), and one none of them joins is left without edges."""
    if wide is None:
        ranks = select_ranks(run, ranks)
        return _assemble(load(run, ranks), ranks)
    ranks = select_ranks(run, ranks, wide.ranks)
    # the given ranks' events through views of their files alone: a scan of every rank's files filtered by rank
    # took minutes of a 16,384-rank what-if that builds 10 ranks' graph
    sub = run.subset(ranks) if hasattr(run, "subset") and len(ranks) < len(wide.ranks) else run
    try:
        d = load(sub, ranks, comm=wide.comm[wide.comm["rank"].isin(ranks)], steps=wide.steps, hosts=wide.hosts)
    finally:
        if sub is not run:
            sub.close()
    return _assemble(d, ranks, wide)


def _assemble(d: Loaded, ranks, wide: RunWide | None = None) -> Graph:
    cpu, gpu, steps = d.cpu, d.gpu, d.steps
    if cpu.empty and gpu.empty:
        raise TracekitError("no CPU ops, runtime calls or GPU ops with durations in the selected ranks: "
                            "nothing to replay")
    notes: list[str] = []
    cpu = cpu.assign(end_ns=cpu.ts_ns + cpu.dur_ns)
    gpu = gpu.assign(end_ns=gpu.ts_ns + gpu.dur_ns)
    # the origin precedes every node and every step annotation (a step can open before its first op)
    t0 = int(min(x.ts_ns.min() for x in (cpu, gpu, steps) if len(x))) if wide is None else wide.origin_ns
    tracks = track_table(cpu, gpu)
    if wide is None:
        colls, members, laneless = collectives(d.comm, d.hosts, notes, cpu, gpu, working_spans(cpu) if len(cpu) else {})
    else:
        loaded = set(ranks)
        colls, laneless = wide.colls, wide.laneless[wide.laneless["rank"].isin(loaded)]
        members = {k: c for k, c in wide.members.items() if k[0] in loaded}
        notes.extend(wide.notes)
    nodes = NodeMap()
    add_roles(nodes, cpu, members)

    nb = Builder()
    origin = nb.add(K["origin"], -1, -1, -1, [t0], [0], "origin")[0]
    chains = add_tracks(nb, nodes, cpu, gpu, notes, waits_by_track(colls, tracks) if len(colls) else None)
    laneless_participants(nb, nodes, laneless)
    bar_ids = {}
    if len(colls):
        ids = nb.add(K["barrier"], -1, -1, -1, colls.barrier_start_ns.to_numpy(np.int64),
                     colls.measured_transfer_ns.to_numpy(np.int64), colls.op.astype(object).to_numpy(),
                     colls.coll_id.to_numpy(np.int64))
        bar_ids = dict(zip(colls.coll_id.astype(int), ids.tolist()))
        behind = [(bar_ids[int(y)], bar_ids[int(x)]) for x, y in zip(colls.coll_id, colls.after_coll) if y >= 0]
        if behind:
            nb.link([y for y, _ in behind], [x for _, x in behind], True, "pair_order")
    for ids, is_gpu in chains:
        nb.link([origin], ids[:1], True, "origin")
        nb.link(ids[:-1], ids[1:], True, "stream" if is_gpu else "thread")

    arr, _ = nb.arrays()
    counts = {}
    if len(gpu) and len(cpu):
        counts.update(gpu_edges(nb, arr, nodes, cpu, gpu, d.cuda_sync))
    if len(colls):
        counts.update(collective_edges(nb, arr, nodes, colls, d.comm, tracks, bar_ids, chains))
        # a collective none of whose calls is a participant node (each spans several CPU pieces: see the note)
        # has a barrier nothing arrives at: it starts from the origin, at its measured time
        has_in = nb.has_incoming()
        joined = bar_ids if wide is None else {c: b for c, b, rks in zip(colls.coll_id, bar_ids.values(),
                                                                          colls.present_ranks) if loaded & set(rks)}
        orphans = [b for b in joined.values() if not has_in[b]]
        if orphans:
            nb.link([origin] * len(orphans), orphans, True, "origin")

    arr, (src, dst, from_end, ekind) = nb.arrays()
    g = Graph(kind=arr["kind"], rank=arr["rank"], track=arr["track"], event_id=arr["event_id"],
              start_ns=arr["start_ns"], dur_ns=arr["dur_ns"], coll=arr["coll"], name=arr["name"],
              src=src, dst=dst, from_end=from_end, edge_kind=ekind, lag_ns=np.zeros(len(src), np.int64),
              tracks=tracks, hosts=d.hosts, colls=colls, steps=steps, ranks=list(ranks), origin_ns=t0, notes=notes,
              stats=counts)
    bind_lags(g)
    return g
