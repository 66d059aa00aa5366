"""Critical path of one step on one rank, its breakdown, and a Chrome-trace overlay of it.

The dependency graph (nodes = start and end of every runtime call and GPU op in the step):
  CPU thread order   consecutive runtime calls on a thread (the gap is CPU work)
  launch -> op       the launching call's start -> the GPU op's start (correlation)
  stream order       consecutive GPU ops on a stream
  event wait         cudaStreamWaitEvent: the last op launched on the awaited stream before the wait
                     call -> the next op on the waiting stream
  sync               a synchronize call ends after the last op it waited for (its stream, or any
                     stream for device/context syncs)
Edge weights are the measured times between their nodes, so every path ends at the last event; the
longest path (topological order + dynamic programming) prefers, at every node, the dependency that
was satisfied last: the one that actually held the node back. Path segments are then labelled
cpu (CPU work between calls), launch_overhead (launch calls and launch-to-start waits), compute,
communication, memory, other (GPU ops by class), gpu_wait (stream gaps) and sync.
"""
from __future__ import annotations

import json
from collections import defaultdict

from tracekit.errors import TracekitError

from ._sql import check_scope, prepare, query, with_note

COLUMNS = {
    "rank": "global rank",
    "step": "ProfilerStep#N analysed (NULL: the whole trace)",
    "seq": "position on the path, from the start",
    "category": "cpu | launch_overhead | compute | communication | memory | other | gpu_wait | sync",
    "name": "the call or GPU op the segment belongs to (the later event for dependency edges)",
    "where": "cpu:<tid> or stream:<stream>",
    "start_ns": "segment start, trace clock ns",
    "dur_ns": "segment length, ns",
}
SUMMARY_COLUMNS = {
    "rank": "global rank",
    "step": "ProfilerStep#N analysed (NULL: the whole trace)",
    "category": "cpu | launch_overhead | compute | communication | memory | other | gpu_wait | sync",
    "path_ns": "time of the critical path in this category, ns",
    "path_pct": "path_ns / length of the path, percent",
}
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
               "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize")
_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset", "hipLaunch", "hipExtModuleLaunch",
                    "hipMemcpy", "hipMemset", "cudaGraphLaunch", "hipModuleLaunch")


def _pick_scope(run, rank, step):
    if rank is None:
        rank = int(run.sql("SELECT min(rank) AS r FROM ranks")["r"].iloc[0])
    check_scope(run, rank, step)
    if step is None:
        steps = run.sql("SELECT step FROM steps WHERE rank = $rank AND NOT is_last ORDER BY step", {"rank": rank})
        if len(steps):  # the first complete step; the last is often cut short by the profiler
            step = int(steps.step.iloc[0])
    return rank, step


def _build(run, rank, step):
    window = query(run, "_cp_window", rank=rank, step=step).iloc[0]
    lo, hi = int(window.start_ns), int(window.end_ns) + 1
    calls = query(run, "_cp_calls", rank=rank, start_ns=lo, end_ns=hi)
    ops = query(run, "_cp_gpu_ops", rank=rank, start_ns=lo, end_ns=hi)
    syncs = query(run, "_cp_syncs", rank=rank)
    times, labels, edges = [], [], []  # labels[n] = (name, where, category of the event's own edge)

    def node(t, label):
        times.append(int(t))
        labels.append(label)
        return len(times) - 1

    call_nodes = {}
    for c in calls.itertuples(index=False):
        is_sync = c.name in _SYNC_CALLS
        cat = "sync" if is_sync else "launch_overhead" if c.name.startswith(_LAUNCH_PREFIXES) else "cpu"
        s, e = node(c.ts_ns, (c.name, f"cpu:{c.tid}", cat)), node(c.end_ns, (c.name, f"cpu:{c.tid}", cat))
        edges.append((s, e, cat))
        call_nodes[c.event_id] = (s, e, c)
    by_corr = {c.correlation: call_nodes[c.event_id] for c in calls.itertuples(index=False) if c.correlation == c.correlation}
    for _tid, group in calls.groupby("tid"):
        ids = list(group.event_id)
        for a, b in zip(ids, ids[1:]):
            edges.append((call_nodes[a][1], call_nodes[b][0], "cpu"))
    source = node(lo, ("step start", "cpu", "cpu"))
    for _tid, group in calls.groupby("tid"):
        edges.append((source, call_nodes[group.event_id.iloc[0]][0], "cpu"))

    op_nodes, by_stream = {}, defaultdict(list)
    for o in ops.itertuples(index=False):
        s, e = node(o.ts_ns, (o.name, f"stream:{o.stream}", o.kernel_class)), node(o.end_ns, (o.name, f"stream:{o.stream}", o.kernel_class))
        edges.append((s, e, o.kernel_class))
        op_nodes[o.event_id] = (s, e, o)
        by_stream[o.stream].append(o.event_id)
        launch = by_corr.get(o.correlation)
        if launch:
            edges.append((launch[0], s, "launch_overhead"))
    for ids in by_stream.values():
        for a, b in zip(ids, ids[1:]):
            edges.append((op_nodes[a][1], op_nodes[b][0], "gpu_wait"))

    sync_of = {s.correlation: s for s in syncs.itertuples(index=False)}
    for s, e, c in call_nodes.values():
        rec = sync_of.get(c.correlation)
        if c.name in _SYNC_CALLS:
            stream = rec.stream if rec is not None and rec.stream is not None and rec.stream < 2**31 else None
            done = [v for v in op_nodes.values() if v[2].end_ns <= c.end_ns and (stream is None or v[2].stream == stream)]
            if done:
                last = max(done, key=lambda v: v[2].end_ns)
                edges.append((last[1], e, "sync"))
        elif rec is not None and rec.wait_on_stream == rec.wait_on_stream and rec.wait_on_stream is not None:
            before = [op_nodes[i] for i in by_stream.get(rec.wait_on_stream, []) if by_corr.get(op_nodes[i][2].correlation)
                      and times[by_corr[op_nodes[i][2].correlation][0]] < c.ts_ns]
            after = [op_nodes[i] for i in by_stream.get(rec.stream, []) if op_nodes[i][2].ts_ns >= rec.ts_ns]
            if before and after:
                edges.append((before[-1][1], after[0][0], "gpu_wait"))
    return times, labels, edges, source


def longest_path(times, edges, source):
    """Longest path from source over a DAG whose edges run forward in time; ties go to the
    predecessor reached last (the dependency that held the node back). Returns edge list."""
    incoming = defaultdict(list)
    for u, v, kind in edges:
        if times[u] <= times[v]:
            incoming[v].append((u, kind))
    order = sorted(range(len(times)), key=lambda n: (times[n], n))
    dist = {source: 0}
    best = {}
    for v in order:
        for u, kind in incoming.get(v, ()):
            if u not in dist:
                continue
            # on a tie in time, a launch edge wins over a stream edge: an op whose stream was
            # already free when its launch began waited on the launch, not on the stream
            cand = (dist[u] + times[v] - times[u], times[u], kind in ("launch_overhead", "sync"), u)
            if v not in best or cand > best[v][0]:
                best[v] = (cand, u, kind)
        if v in best and v != source:
            dist[v] = best[v][0][0]
    if len(dist) == 1:
        return []
    sink = max(dist, key=lambda n: (dist[n], times[n]))
    path = []
    while sink != source:
        _, u, kind = best[sink]
        path.append((u, sink, kind))
        sink = u
    return path[::-1]


def critical_path(run, rank: int | None = None, step: int | None = None, *, overlay_path: str = ""):
    """Segments of the critical path of one step (default: the first complete one) on one rank."""
    import pandas as pd

    prepare(run)
    rank, step = _pick_scope(run, rank, step)
    times, labels, edges, source = _build(run, rank, step)
    path = longest_path(times, edges, source)
    rows = [{"rank": rank, "step": step, "seq": i, "category": kind, "name": labels[v][0], "where": labels[v][1],
             "start_ns": times[u], "dur_ns": times[v] - times[u]} for i, (u, v, kind) in enumerate(path)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    if overlay_path:
        write_overlay(df, overlay_path)
    return df if len(df) else with_note(df, "no runtime calls or GPU ops in this step: no critical path")


def critical_path_summary(run, rank: int | None = None, step: int | None = None):
    """Share of the critical path that is CPU-bound, launch overhead, compute, communication, memory..."""
    df = critical_path(run, rank, step)
    if df.empty:
        return with_note(df.reindex(columns=list(SUMMARY_COLUMNS)), df.attrs.get("note", ""))
    out = df.groupby(["rank", "step", "category"], dropna=False, as_index=False)["dur_ns"].sum()
    out = out.rename(columns={"dur_ns": "path_ns"})
    out["path_pct"] = 100.0 * out.path_ns / out.path_ns.sum()
    return out.sort_values("path_ns", ascending=False, kind="stable").reset_index(drop=True)[list(SUMMARY_COLUMNS)]


def write_overlay(df, path: str) -> None:
    """The path as a Chrome trace (open it in Perfetto next to the original trace): one track per
    category, times in us on the trace's own clock."""
    events = [{"ph": "X", "cat": "critical_path", "name": f"{r.category}: {r.name}", "pid": "critical path",
               "tid": r.category, "ts": r.start_ns / 1000, "dur": r.dur_ns / 1000,
               "args": {"where": r.where, "seq": int(r.seq)}} for r in df.itertuples(index=False) if r.dur_ns > 0]
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    except OSError as e:
        raise TracekitError(f"--overlay {path}: {e.strerror}") from None
