"""The dependency edges between tracks: launch -> GPU op, the awaited GPU op -> a sync call's return,
event record -> stream wait, and around each collective arrive / release, gloo enqueue and host waits."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .model import RUNTIME_CATS, SYNC_CALLS, Builder, K, NodeMap
from .tracks import track_keys


def gpu_edges(nb: Builder, arr: dict, nodes: NodeMap, cpu, gpu, cuda_sync) -> dict:
    """launch -> GPU op; last awaited GPU op -> sync return; cudaEventRecord/cudaStreamWaitEvent pairs.
    arr: the node arrays so far; returns the edge counts by kind."""
    rt = cpu[cpu.cat.isin(RUNTIME_CATS)].sort_values(["rank", "tid", "ts_ns", "event_id"], kind="stable")
    ops = gpu.copy()
    ops["node"] = [nodes.first[(int(r), int(e))] for r, e in zip(ops["rank"], ops.event_id)]
    ops["stream"] = ops.tid
    counts = {"launch": _launch_edges(nb, arr, nodes, rt, ops)}
    counts["sync"] = _sync_edges(nb, nodes, rt, ops, cuda_sync)
    counts["event_wait"] = _event_wait_edges(nb, rt, ops, cuda_sync)
    return counts


def _launch_edges(nb: Builder, arr: dict, nodes: NodeMap, rt, ops) -> int:
    """launch call -> its GPU op, by correlation; sets ops.launch_ts and ops.launch_event (-1: none)."""
    launch_of = {}
    with_corr = rt[rt.correlation.notna()]
    lmap = dict(zip(zip(with_corr["rank"].astype(int), with_corr.correlation.astype(np.int64)),
                    with_corr.event_id.astype(np.int64)))
    src, dst, launch_ts = [], [], np.full(len(ops), np.iinfo(np.int64).min, np.int64)
    for k, (r, corr, n) in enumerate(zip(ops["rank"].to_numpy(), ops.correlation.to_numpy(), ops.node.to_numpy())):
        if pd.isna(corr):
            continue
        ev = lmap.get((int(r), int(corr)))
        if ev is None:
            continue
        s = nodes.first[(int(r), int(ev))]
        src.append(s)
        dst.append(int(n))
        launch_of[int(n)] = s
        launch_ts[k] = arr["start_ns"][s]
    nb.link(src, dst, False, "launch")
    ops["launch_ts"] = launch_ts
    ops["launch_event"] = [-1 if s is None else int(arr["event_id"][s]) for s in (launch_of.get(int(n)) for n in ops.node)]
    return len(src)


def _sync_edges(nb: Builder, nodes: NodeMap, rt, ops, cuda_sync) -> int:
    """sync return <- the last GPU op it waited for (its stream when cuda_sync says which); a blocking
    memcpy waits for its own copy."""
    sync_stream = {}
    if len(cuda_sync):
        for r, c, s in zip(cuda_sync["rank"], cuda_sync.correlation, cuda_sync.stream):
            if not pd.isna(s) and 0 <= s < 2**31:
                sync_stream[(int(r), int(c))] = int(s)
    s_src, s_dst = [], []
    syncs = rt[rt.name.isin(SYNC_CALLS)]
    for r, grp in ops.groupby("rank", sort=False):
        grp = grp.sort_values("end_ns", kind="stable")
        ends = grp.end_ns.to_numpy(np.int64)
        lts = grp.launch_ts.to_numpy(np.int64)
        st = grp.stream.to_numpy(np.int64)
        nd = grp.node.to_numpy(np.int64)
        lev = grp.launch_event.to_numpy(np.int64)
        for ev, ts, end, corr in zip(*(syncs[syncs["rank"] == r][c].to_numpy() for c in ("event_id", "ts_ns", "end_ns", "correlation"))):
            x = nodes.exit_of.get(nodes.first.get((int(r), int(ev))))
            if x is None:
                continue
            own = np.flatnonzero(lev == ev)
            if len(own):
                s_src.append(int(nd[own[-1]]))
                s_dst.append(x)
                continue
            stream = None if pd.isna(corr) else sync_stream.get((int(r), int(corr)))
            j = np.searchsorted(ends, end, side="right") - 1
            while j >= 0 and (lts[j] >= ts or (stream is not None and st[j] != stream)):
                j -= 1
            if j >= 0:
                s_src.append(int(nd[j]))
                s_dst.append(x)
    nb.link(s_src, s_dst, True, "sync")
    return len(s_src)


def _event_wait_edges(nb: Builder, rt, ops, cuda_sync) -> int:
    """cudaStreamWaitEvent W after cudaEventRecord R on a thread: the GPU op launched last before R (on
    the recording stream) -> the first op launched after W (on the waiting stream), when the streams
    differ. Kineto's cuda_sync records, when present, name the streams."""
    launched = ops[ops.launch_event >= 0]
    if launched.empty:
        return 0
    by_launch = dict(zip(zip(launched["rank"], launched.launch_event), zip(launched.node, launched.stream)))
    waits = {}
    if len(cuda_sync):
        for r, c, s, w in zip(cuda_sync["rank"], cuda_sync.correlation, cuda_sync.stream, cuda_sync.wait_on_stream):
            if not pd.isna(w) and not pd.isna(s):
                waits[(int(r), int(c))] = (int(s), int(w))
    src, dst = [], []
    for (r, _tid), g in rt.groupby(["rank", "tid"], sort=False):
        last_op = {}  # stream -> node of the op launched last on it
        prev_stream_op = None  # (node, stream) of the op launched last on this thread
        record = None  # the op recorded by the latest cudaEventRecord, with its stream
        pending = []  # waits that apply to the next launch: (producer node, producer stream)
        for ev, name, corr in zip(g.event_id.to_numpy(), g.name.to_numpy(), g.correlation.to_numpy()):
            hit = by_launch.get((r, int(ev)))
            if hit is not None:
                node, stream = int(hit[0]), int(hit[1])
                for p_node, p_stream in pending:
                    if p_stream != stream:
                        src.append(p_node)
                        dst.append(node)
                pending = []
                last_op[stream] = node
                prev_stream_op = (node, stream)
            elif name in ("cudaEventRecord", "hipEventRecord", "cuEventRecord"):
                record = prev_stream_op
            elif name in ("cudaStreamWaitEvent", "hipStreamWaitEvent", "cuStreamWaitEvent"):
                known = None if pd.isna(corr) else waits.get((int(r), int(corr)))
                if known is not None and known[1] in last_op:
                    pending.append((last_op[known[1]], known[1]))
                elif record is not None:
                    pending.append(record)
    nb.link(src, dst, True, "event_wait")
    return len(src)


def laneless_participants(nb: Builder, nodes: NodeMap, laneless) -> None:
    """The participants that sit on no track (gloo's send and recv: the call posts the transfer and returns, an
    annotation on the caller's thread times it): an arrival instant at the call's start (collectives._participants)
    and an exit at the annotation's end, each pair on no track; the call enqueues the arrival (collective_edges)."""
    for r, e, name, ts, end, c in zip(laneless["rank"], laneless.event_id, laneless.name, laneless.ts_ns,
                                      laneless.end_ns, laneless.coll_id):
        ids = nb.add([K["comm"], K["comm_exit"]], int(r), -1, int(e), [int(ts), int(end)], [0, 0], name, int(c))
        nodes.first[(int(r), int(e))] = int(ids[0])
        nodes.exit_of[int(ids[0])] = int(ids[1])
        nb.link(ids[:1], ids[1:], True, "posted")


def collective_edges(nb: Builder, arr: dict, nodes: NodeMap, colls, rows, tracks, bar_ids: dict, chains) -> dict:
    """arrive / release around each barrier (bar_ids: coll_id -> barrier node); gloo enqueue and host
    waits. Returns the edge counts by kind."""
    counts = _barrier_edges(nb, arr, nodes, colls, bar_ids)
    counts.update(_gloo_edges(nb, arr, nodes, colls, rows, tracks, bar_ids, chains))
    return counts


def _barrier_edges(nb: Builder, arr: dict, nodes: NodeMap, colls, bar_ids: dict) -> dict:
    """participant arrival -> barrier; barrier end -> each participant's exit. A participant that finished
    before the shared transfer ended (a send whose bytes were in the socket buffer before the recv had them, a
    tree that let a rank go) but after it began is released from the barrier's start: it finished part way
    through the transfer, not on its own clock."""
    first, exit_of = nodes.first, nodes.exit_of
    a_src, a_dst, r_src, r_dst, e_src, e_dst = [], [], [], [], [], []
    for c, rks, evs, early, start in zip(colls.coll_id, colls.present_ranks, colls.events, colls.early,
                                         colls.barrier_start_ns):
        bar = bar_ids[int(c)]
        for r, e, er in zip(rks, evs, early):
            f = first.get((int(r), int(e)))
            if f is None or f not in exit_of:
                continue
            a_src.append(f)
            a_dst.append(bar)
            if not er:
                r_src.append(bar)
                r_dst.append(exit_of[f])
            elif arr["start_ns"][exit_of[f]] >= int(start):
                e_src.append(bar)
                e_dst.append(exit_of[f])
    nb.link(a_src, a_dst, False, "arrive")
    nb.link(r_src, r_dst, True, "release")
    nb.link(e_src, e_dst, False, "release")
    return {"arrive": len(a_src), "release": len(r_src) + len(e_src)}


def _gloo_edges(nb: Builder, arr: dict, nodes: NodeMap, colls, rows, tracks, bar_ids: dict, chains) -> dict:
    """gloo: the call enqueues the runloop's work; a caller that sat idle through the transfer blocked in
    wait() and woke when the collective completed: the barrier's end -> its first op after the wake (its own
    participant's exit where that finished before the transfer did: a send the receiver's recv released)."""
    first = nodes.first
    # the participant a call hands its work to: the runloop's annotation, or a send's / recv's own annotation
    loose = rows.assign(work=rows.runloop_event_id.fillna(rows.nested_event_id))
    loose = loose[loose.work.notna() & loose.cpu_event_id.notna()]
    q_src, q_dst, w_src, w_dst = [], [], [], []
    for r, call, loop in zip(loose["rank"].astype(int), loose.cpu_event_id.astype(np.int64),
                             loose.work.astype(np.int64)):
        cf, lf = first.get((r, int(call))), first.get((r, int(loop)))
        if cf is not None and lf is not None:
            q_src.append(cf)
            q_dst.append(lf)
    track, start = arr["track"], arr["start_ns"]
    chain_of = {}
    for ids, is_gpu in chains:
        if not is_gpu and len(ids):
            chain_of[int(track[ids[0]])] = ids
    tkey = track_keys(tracks)
    for c, wakes, callers, early, evs in zip(colls.coll_id, colls.wakes, colls.callers, colls.early, colls.events):
        for w, (r, pid, tid), er, e in zip(wakes, callers, early, evs):
            if w < 0 or pd.isna(pid):
                continue
            ids = chain_of.get(tkey.get((int(r), int(pid), int(tid)), -1))
            if ids is None:
                continue
            j = np.searchsorted(start[ids], int(w), side="left")
            if j < len(ids) and start[ids[j]] == int(w):
                # a participant done before the transfer ended (a gloo send, complete once the receiver posted
                # its recv: the rendezvous) woke its caller then, not at the message's arrival: its exit
                f = nodes.first.get((int(r), int(e))) if er else None
                w_src.append(nodes.exit_of[f] if f in nodes.exit_of else bar_ids[int(c)])
                w_dst.append(int(ids[j]))
    nb.link(q_src, q_dst, False, "enqueue")
    nb.link(w_src, w_dst, True, "host_wait")
    return {"enqueue": len(q_src), "host_wait": len(w_src)}
