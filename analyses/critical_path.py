"""Critical path of one step on one rank, its breakdown, and a Chrome-trace overlay of it.

The path comes from the rank's dependency graph (analyses.depgraph, the graph the replay re-times: CPU
thread pieces, runtime calls, GPU ops, launch, stream, event-wait and sync edges, collectives). On the
measured times every node's critical predecessor is its binding dependency, the one satisfied last (on
a tie the launch or sync over the stream); walking back from the step's last node along them gives the
path, clipped at the step's start. Each node on it adds its own time, each edge the gap between the
dependency being met and the node starting. Segments are labelled cpu (CPU work and gaps on a thread),
launch_overhead (launch calls and launch-to-start waits), compute, communication, memory, other (GPU ops
by class; collectives), gpu_wait (stream gaps) and sync.
"""
from __future__ import annotations

import json

import numpy as np

from tracekit.errors import TracekitError

from ._sql import check_scope, query, with_note
from .depgraph import SYNC_CALLS, E, K, build
from .depgraph.lags import critical_edges

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
_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset", "hipLaunch", "hipExtModuleLaunch",
                    "hipMemcpy", "hipMemset", "cudaGraphLaunch", "hipModuleLaunch")
# the category of the gap an edge leaves before its node starts
_GAP = {E["origin"]: "cpu", E["thread"]: "cpu", E["stream"]: "gpu_wait", E["launch"]: "launch_overhead",
        E["event_wait"]: "gpu_wait", E["sync"]: "sync", E["enqueue"]: "communication",
        E["host_wait"]: "communication", E["arrive"]: "communication", E["release"]: "communication",
        E["pair_order"]: "communication",
        E["posted"]: "communication"}


def _categories(g, nodes):
    """The category of each node's own time."""
    kind = g.kind
    cat = np.full(g.n_nodes, "cpu", dtype=object)
    runtime = np.flatnonzero(kind == K["runtime"])
    cat[runtime] = ["sync" if n in SYNC_CALLS else "launch_overhead" if n.startswith(_LAUNCH_PREFIXES) else "cpu"
                    for n in g.name[runtime]]
    cat[np.isin(kind, (K["sync"], K["sync_exit"]))] = "sync"
    cat[np.isin(kind, (K["comm"], K["comm_exit"], K["barrier"]))] = "communication"
    gpu = nodes.kernel_class.notna().to_numpy()
    cat[gpu] = nodes.kernel_class.to_numpy(object)[gpu]
    return cat


def _where(g) -> np.ndarray:
    """cpu:<tid> or stream:<stream> of each node (None: origin, barriers)."""
    labels = np.array([f"{'stream' if gpu else 'cpu'}:{tid}" for gpu, tid in zip(g.tracks.is_gpu, g.tracks.tid)]
                      + [None], dtype=object)
    return labels[g.track]  # track -1 picks the trailing None


def _last_node(g, lo: int, hi: int) -> int:
    """The node of the step that ends last: CPU nodes starting in [lo, hi), GPU nodes launched in it."""
    launch_ts = np.full(g.n_nodes, np.iinfo(np.int64).min, np.int64)
    launch = g.edge_kind == E["launch"]
    launch_ts[g.dst[launch]] = g.start_ns[g.src[launch]]
    exits = np.flatnonzero(g.kind == K["comm_exit"])
    launch_ts[exits] = launch_ts[exits - 1]  # a collective's exit belongs to its entry's launch
    on_gpu = g.tracks.is_gpu.to_numpy(bool)[np.maximum(g.track, 0)] & (g.track >= 0)
    when = np.where(on_gpu, launch_ts, g.start_ns)
    cand = np.flatnonzero((g.track >= 0) & (when >= lo) & (when < hi))
    if not len(cand):
        return -1
    return int(cand[np.argmax(g.start_ns[cand] + g.dur_ns[cand])])


def _walk(g, v: int, lo: int):
    """Segments (node, start_ns, end_ns, what, index) from node v's end back to the step's start lo, latest
    first: what "node" for a node's own time, "edge" (index: the edge) for the gap before a node starts."""
    crit = critical_edges(g)
    start, end = g.start_ns, g.start_ns + g.dur_ns
    at_end = True
    out = []
    cursor = int(end[v])  # the earliest time covered so far: segments never overlap, even on clock noise
    while True:
        if at_end and g.dur_ns[v] > 0:
            out.append((v, max(int(start[v]), lo), min(int(end[v]), cursor), "node", v))
            cursor = min(cursor, int(start[v]))
        e = crit[v]
        if e < 0 or start[v] <= lo:
            break
        u = int(g.src[e])
        at_end = bool(g.from_end[e])
        # the origin stands for the window's start: time before the first node counts as CPU time
        ready = lo if g.kind[u] == K["origin"] else int(end[u] if at_end else start[u])
        if ready < start[v]:
            out.append((v, max(ready, lo), min(int(start[v]), cursor), "edge", e))
            cursor = min(cursor, ready)
        v = u
        if ready <= lo:
            break
    return [x for x in out if x[2] > x[1]]


def _gap_category(g, e: int, dst: int) -> str:
    if g.kind[dst] == K["sync_exit"]:
        return "sync"
    if g.kind[dst] == K["comm_exit"]:
        return "communication"
    return _GAP[int(g.edge_kind[e])]


def _pick_scope(run, rank, step):
    if rank is None:
        rank = int(run.sql("SELECT min(rank) AS r FROM ranks")["r"].iloc[0])
    check_scope(run, rank, step)
    if step is None:
        steps = run.sql("SELECT step FROM steps WHERE rank = $rank AND NOT is_last ORDER BY step", {"rank": rank})
        if len(steps):  # the first complete step; the last is often cut short by the profiler
            step = int(steps.step.iloc[0])
    return rank, step


def critical_path(run, rank: int | None = None, step: int | None = None, *, overlay_path: str = ""):
    """Segments of the critical path of one step (default: the first complete one) on one rank."""
    import pandas as pd

    rank, step = _pick_scope(run, rank, step)
    window = query(run, "_cp_window", rank=rank, step=step).iloc[0]
    rows = []
    if not pd.isna(window.start_ns):
        rows = _segments(run, rank, step, int(window.start_ns), int(window.end_ns) + 1)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    if overlay_path:
        write_overlay(df, overlay_path)
    return df if len(df) else with_note(df, "no CPU ops, runtime calls or GPU ops in this step: no critical path")


def _segments(run, rank: int, step, lo: int, hi: int) -> list[dict]:
    try:
        g = build(run, [rank])
    except TracekitError:  # nothing with a duration on this rank
        return []
    v = _last_node(g, lo, hi)
    if v < 0:
        return []
    cat, where = _categories(g, g.nodes()), _where(g)
    rows = []
    name = place = None
    for node, a, z, what, idx in _walk(g, v, lo):
        if g.track[node] >= 0:  # a collective's barrier is named after its participant on this rank
            name, place = g.name[node], where[node]
        category = cat[node] if what == "node" else _gap_category(g, idx, node)
        rows.append({"rank": rank, "step": step, "category": category, "name": name, "where": place,
                     "start_ns": a, "dur_ns": z - a})
    rows.reverse()
    for i, r in enumerate(rows):
        r["seq"] = i
    return rows


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
