"""The nodes on each track: the track table (one per CPU thread and GPU stream of a rank), CPU threads cut
into pieces at every runtime call, collective call and annotation, GPU streams one node per op, and the
(entry, exit) pairs of sync calls and collective participants."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..intervals import union_spans
from .model import RUNTIME_CATS, SYNC_CALLS, WAIT_CALLS, Builder, K, NodeMap


def track_table(cpu: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """track, rank, pid, tid, is_gpu, main (the rank's busiest CPU thread); sets cpu.track and gpu.track."""
    tracks = pd.concat([cpu[["rank", "pid", "tid"]].drop_duplicates().assign(is_gpu=False),
                        gpu[["rank", "pid", "tid"]].drop_duplicates().assign(is_gpu=True)], ignore_index=True)
    tracks = tracks.sort_values(["rank", "is_gpu", "pid", "tid"], kind="stable").reset_index(drop=True)
    tracks["track"] = np.arange(len(tracks), dtype=np.int64)
    size = cpu.groupby(["rank", "pid", "tid"], as_index=False).size()
    main = size.sort_values(["rank", "size", "pid", "tid"], ascending=[True, False, True, True]).drop_duplicates("rank")
    tracks = tracks.merge(main[["rank", "pid", "tid"]].assign(main=True), how="left", on=["rank", "pid", "tid"])
    tracks["main"] = tracks["main"].eq(True)
    tkey = tracks.set_index(["rank", "pid", "tid"])["track"]

    def track_of(df):
        return tkey.reindex(pd.MultiIndex.from_frame(df[["rank", "pid", "tid"]])).to_numpy(np.int64)

    cpu["track"] = track_of(cpu) if len(cpu) else np.zeros(0, np.int64)
    gpu["track"] = track_of(gpu) if len(gpu) else np.zeros(0, np.int64)
    return tracks


def track_keys(tracks: pd.DataFrame) -> dict:
    """{(rank, pid, tid): track}, for looking up one thread at a time."""
    return {(int(r), int(p), int(t)): int(k) for r, p, t, k in zip(tracks["rank"], tracks.pid, tracks.tid, tracks.track)}


def add_roles(nodes: NodeMap, cpu: pd.DataFrame, members: dict) -> None:
    """Sync calls and collective participants ({(rank, event_id): coll_id}) become (entry, exit) pairs."""
    for r, e, n in zip(cpu["rank"].to_numpy(), cpu.event_id.to_numpy(), cpu.name.to_numpy()):
        if n in SYNC_CALLS:
            nodes.role[(int(r), int(e))] = ("sync", -1)
    for (r, e), c in members.items():
        nodes.role[(r, e)] = ("comm", c)


def add_tracks(nb: Builder, nodes: NodeMap, cpu: pd.DataFrame, gpu: pd.DataFrame, notes: list,
               waits: dict | None = None) -> list:
    """Every track's nodes in order: [(node ids, is_gpu)], CPU threads first. waits: {track: (starts, ends)} of
    the times a thread sat blocked on a collective (left out of its pieces: a gap whose end the collective's
    completion decides, not CPU time of a fixed length)."""
    chains = []
    multi = 0
    waits = waits or {}
    for t, g in cpu.groupby("track", sort=True):
        ids, m = _cpu_track(nb, int(t), g, nodes, waits.get(int(t)))
        chains.append((ids, False))
        multi += m
    for t, g in gpu.groupby("track", sort=True):
        chains.append((_gpu_track(nb, int(t), g, nodes), True))
    if multi:
        notes.append(f"{multi} collective or sync call(s) span several CPU pieces: replayed with their measured time")
    return chains


def working_spans(cpu: pd.DataFrame) -> dict:
    """{(rank, pid, tid): (starts, ends)}: when each CPU thread was working, the union of its innermost operators
    and runtime calls (those with nothing nested inside). Time in an enclosing operator or annotation outside
    its children, and time in a wait call (WAIT_CALLS), is not work: a thread blocked in Work.wait() (no event),
    in wait_tensor, or inside the region that called it (FSDP's all-gather, an autograd node whose hook waits
    for a bucket) shows there as idle."""
    out = {}
    ops = cpu[(cpu.cat != "user_annotation") & ~cpu.name.isin(WAIT_CALLS)]
    for key, g in ops.sort_values(["rank", "pid", "tid", "ts_ns", "end_ns"], ascending=[True, True, True, True, False],
                                  kind="stable").groupby(["rank", "pid", "tid"], sort=False):
        ts, end = g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64)
        leaf = np.ones(len(ts), bool)
        leaf[:-1] = ts[1:] >= end[:-1]  # nothing starts inside it before it ends (events on a thread nest)
        out[tuple(int(k) for k in key)] = union_spans(ts[leaf], end[leaf]) if leaf.any() else (ts[:0], end[:0])
    return out


def _cpu_track(nb: Builder, track: int, g: pd.DataFrame, nodes: NodeMap, waits=None):
    """Cut a thread's busy time into pieces at every special event's start and end, leaving out the waits
    ((starts, ends)); a sync call or a collective participant that is a single piece becomes an instant
    followed by its exit node."""
    g = g.sort_values(["ts_ns", "end_ns", "event_id"], ascending=[True, False, True], kind="stable")
    ts, end, eid = g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64), g.event_id.to_numpy(np.int64)
    names = g.name.to_numpy(object)
    cat = g.cat.to_numpy(object)
    special = np.isin(cat, RUNTIME_CATS) | (cat == "user_annotation") | np.char.startswith(names.astype(str), "c10d::")
    a, z = _cut(ts, end, special, waits)
    owner = _owners(ts, end, np.arange(len(ts)), a, z)
    rank = int(g["rank"].iat[0])
    kind = np.where(owner >= 0, np.where(np.isin(cat[np.maximum(owner, 0)], RUNTIME_CATS), K["runtime"], K["cpu"]),
                    K["cpu"]).astype(np.int8)
    piece_event = np.where(owner >= 0, eid[np.maximum(owner, 0)], -1)
    piece_name = np.where(owner >= 0, names[np.maximum(owner, 0)], "cpu").astype(object)
    # special events -> their first and last piece
    sp = np.flatnonzero(special)
    f = np.searchsorted(a, ts[sp], side="left")
    lz = np.searchsorted(z, end[sp], side="right") - 1
    exits = {}  # piece index -> its role, for the pieces that turn into (instant, exit) pairs
    multi = 0
    for k, i in enumerate(sp):
        r = nodes.role.get((rank, int(eid[i])))
        if r is None:
            continue
        if f[k] != lz[k]:
            multi += 1
            continue
        exits[int(f[k])] = r
    ids, slot = _lay_out(nb, rank, track, kind, a, z, piece_event, piece_name, exits)
    for k, i in enumerate(sp):
        entry = int(ids[slot[f[k]]])
        nodes.first[(rank, int(eid[i]))] = entry
        if int(f[k]) in exits and f[k] == lz[k]:
            nodes.exit_of[entry] = entry + 1
    return ids, multi


def _cut(ts: np.ndarray, end: np.ndarray, special: np.ndarray, waits=None):
    """(starts, ends) of a thread's pieces: its busy spans cut at every special event's start and end, without
    the waits ((starts, ends), disjoint and sorted)."""
    gs, ge = union_spans(ts, end)
    ws, we = waits if waits is not None else (ts[:0], ts[:0])
    pts = np.unique(np.concatenate([gs, ge, ts[special], end[special], ws, we]))
    a, z = pts[:-1], pts[1:]
    inside = np.searchsorted(gs, a, side="right") - 1
    keep = (inside >= 0) & (z <= ge[np.maximum(inside, 0)])
    if len(ws):
        w = np.searchsorted(ws, a, side="right") - 1
        keep &= ~((w >= 0) & (z <= we[np.maximum(w, 0)]))
    a, z = a[keep], z[keep]
    zero = end == ts  # zero-length events get a zero-length piece of their own (launches can be 0 ns)
    zero &= special
    if zero.any():
        a = np.concatenate([a, ts[zero]])
        z = np.concatenate([z, ts[zero]])
        order = np.lexsort((z, a))
        a, z = a[order], z[order]
    return a, z


def _gpu_track(nb: Builder, track: int, g: pd.DataFrame, nodes: NodeMap):
    g = g.sort_values(["ts_ns", "event_id"], kind="stable")
    rank = int(g["rank"].iat[0])
    ev = g.event_id.to_numpy(np.int64)
    exits = {}
    for j, e in enumerate(ev):
        r = nodes.role.get((rank, int(e)))
        if r is not None and r[0] == "comm":
            exits[j] = r
    ts, end = g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64)
    ids, slot = _lay_out(nb, rank, track, K["gpu"], ts, end, ev, g.name.to_numpy(object), exits)
    for j in range(len(ev)):
        entry = int(ids[slot[j]])
        nodes.first[(rank, int(ev[j]))] = entry
        if j in exits:
            nodes.exit_of[entry] = entry + 1
    return ids


def _lay_out(nb: Builder, rank: int, track: int, kind, start_ns, end_ns, event_id, name, exits: dict):
    """Add a track's pieces in order; each piece j in exits ({j: ("sync" | "comm", coll_id)}) becomes an
    instant followed by its exit node at the piece's end. Returns the node ids and each piece's slot."""
    n = len(start_ns)
    marks = np.zeros(n, np.int64)
    marks[list(exits)] = 1
    slot = np.arange(n) + np.concatenate([[0], np.cumsum(marks)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    total = n + len(exits)
    kinds = np.empty(total, np.int8)
    starts = np.empty(total, np.int64)
    durs = np.empty(total, np.int64)
    evs = np.empty(total, np.int64)
    nms = np.empty(total, object)
    colls = np.full(total, -1, np.int64)
    kinds[slot], starts[slot], durs[slot], evs[slot], nms[slot] = kind, start_ns, end_ns - start_ns, event_id, name
    for j, (what, c) in exits.items():
        s = slot[j]
        kinds[s], kinds[s + 1] = (K["sync"], K["sync_exit"]) if what == "sync" else (K["comm"], K["comm_exit"])
        starts[s + 1], durs[s], durs[s + 1] = end_ns[j], 0, 0
        evs[s + 1], nms[s + 1] = evs[s], nms[s]
        colls[s] = colls[s + 1] = c
    return nb.add(kinds, rank, track, evs, starts, durs, nms, colls), slot


def _owners(ts, end, idx, a, z):
    """For each piece [a, z): the index of the shortest event that covers it (-1: none)."""
    out = np.full(len(a), -1, np.int64)
    order = np.argsort(end - ts, kind="stable")[::-1]  # longest first: shorter events overwrite
    lo = np.searchsorted(a, ts[order], side="left")
    hi = np.searchsorted(a, end[order], side="left")
    for k, i in enumerate(order):
        if hi[k] > lo[k]:
            out[lo[k]:hi[k]] = idx[i]
        elif end[i] == ts[i] and lo[k] < len(a) and a[lo[k]] == ts[i] and z[lo[k]] == ts[i]:
            out[lo[k]] = idx[i]
    return out
