"""Collective instances across ranks: one row per instance (the communication model's input) from its
participants on each rank, each participant's wait split from the transfer every rank shares, and the
gloo callers' wake-ups."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..intervals import union_spans
from .tracks import track_keys

# ranks: the group's ranks; for a send and its recv [sender, receiver] (group_size 2)
COLUMNS = ["coll_id", "match_key", "op", "bytes", "group_size", "ranks", "n_hosts", "pg_name", "timeline",
           "measured_transfer_ns", "first_arrival_ns", "last_arrival_ns", "barrier_start_ns", "order",
           "present_ranks", "events", "arrivals", "early", "missing_peers", "wakes", "wait_from", "callers",
           "after_coll"]
P2P_OPS = ("send", "recv")
# what a lane-less participant is: the posting call, the annotation that timed the transfer on the rank
LANELESS_COLUMNS = ["rank", "event_id", "call_event_id", "name", "ts_ns", "end_ns", "coll_id"]


def collectives(rows: pd.DataFrame, hosts: pd.DataFrame, notes: list, cpu: pd.DataFrame, gpu: pd.DataFrame,
                spans: dict):
    """One row per collective instance (COLUMNS), its participants' events: {(rank, event_id): coll_id}, and the
    participants that sit on no track (LANELESS_COLUMNS: gloo's send and recv, timed by an annotation that
    outlasts the call on the caller's thread while the thread runs on). A participant's measured time splits
    into its wait (until the last participant arrived) and the transfer (from then to the first finish, which
    every rank shares; for a send and its recv, the recv's: the message has arrived then). spans: each CPU
    thread's working spans (tracks.working_spans), where the callers' waits are found."""
    rows, laneless = _participants(rows, cpu, gpu)
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS), {}, pd.DataFrame(columns=LANELESS_COLUMNS)
    rows = rows.sort_values(["match_key", "rank"], kind="stable").reset_index(drop=True)
    # a send's end says the message left (into the socket's buffer, for a small one): the recv's says it arrived
    sent = rows.op.isin(P2P_OPS) & (rows.call_op == "send")
    # nullable integers: trace times (~1.8e18 ns) lose up to 256 ns as floats, and a recv that ended with its
    # transfer then read as done before it (a participant released early, held to its measured time)
    rows["transfer_end_ns"] = rows.end_ns.astype("Int64").where(~sent)
    grp = rows.groupby("match_key", sort=False)
    agg = grp.agg(first_arrival_ns=("ts_ns", "min"), last_arrival_ns=("ts_ns", "max"),
                  first_end_ns=("transfer_end_ns", "min"),
                  n=("rank", "size"), op=("op", "first"), bytes=("bytes", "max"), group_size=("group_size", "first"),
                  pg_name=("pg_name", "first"), timeline=("timeline", "first"),
                  present_ranks=("rank", list), events=("event_id", list), arrivals=("ts_ns", list))
    agg["pg_ranks"] = grp.pg_ranks.first()
    # when a gloo send completed: its data went out then, so the receiver's ready notice had come (_behind_on_the_pair)
    agg["send_end_ns"] = rows.end_ns.astype("Int64").where(sent).groupby(rows.match_key, sort=False).max()
    for c in ("p2p_src", "p2p_dst"):
        agg[c] = grp[c].first()
    inconsistent = _transfer(agg, rows, spans)
    missing = _groups(agg, dict(zip(hosts["rank"].astype(int), hosts.hostname)))
    df = agg.reset_index()
    df = df.sort_values(["first_arrival_ns", "match_key"], kind="stable").reset_index(drop=True)
    df.insert(0, "coll_id", np.arange(len(df), dtype=np.int64))
    df["order"] = np.arange(len(df), dtype=np.int64)
    df["after_coll"], df["barrier_start_ns"], df["measured_transfer_ns"] = _behind_on_the_pair(df)
    members = {}
    df["bytes"] = df["bytes"].astype("Int64")
    df["n_hosts"] = df["n_hosts"].astype("Int64")
    for c, rks, evs in zip(df.coll_id, df.present_ranks, df.events):
        for r, e in zip(rks, evs):
            members[(int(r), int(e))] = int(c)
    if len(laneless):
        coll_of = dict(zip(df.match_key, df.coll_id))
        laneless = laneless.assign(coll_id=laneless.match_key.map(coll_of).astype(np.int64))
    if inconsistent:
        notes.append(f"{inconsistent} collective(s) had a rank finish before the last one arrived (a tree or "
                     "broadcast that released it early, or unaligned clocks): no shared transfer window, the "
                     "early ranks keep their measured time")
    if missing:
        notes.append(f"{missing} collective(s) have peers outside the replayed ranks: their arrival is taken from "
                     "the measured wait (the present ranks' waits are kept inside the transfer time)")
    return df[COLUMNS], members, laneless[LANELESS_COLUMNS] if len(laneless) else pd.DataFrame(columns=LANELESS_COLUMNS)


def _participants(rows: pd.DataFrame, cpu: pd.DataFrame, gpu: pd.DataFrame):
    """The participants with the event each one is in the graph (the runloop's annotation for gloo, the annotation
    that timed an asynchronous send or recv, the kernel for NCCL, else the call), its measured times, and the
    calling thread; one per rank and instance. Also the lane-less ones (LANELESS_COLUMNS, with match_key)."""
    empty = pd.DataFrame(columns=LANELESS_COLUMNS + ["match_key"])
    if rows.empty:
        return rows, empty
    nested = rows.nested_event_id.notna()
    ev = rows.runloop_event_id.where(rows.timeline == "cpu")
    ev = ev.fillna(rows.kernel_event_id.where(rows.timeline == "gpu")).fillna(rows.cpu_event_id)
    rows = rows.assign(event_id=ev.where(~nested, rows.nested_event_id)).dropna(subset=["event_id"])
    rows["event_id"] = rows.event_id.astype(np.int64)
    times = pd.concat([cpu[["rank", "event_id", "ts_ns", "end_ns"]], gpu[["rank", "event_id", "ts_ns", "end_ns"]]])
    calls = cpu[["rank", "event_id", "pid", "tid", "ts_ns"]].rename(
        columns={"event_id": "cpu_event_id", "pid": "call_pid", "tid": "call_tid", "ts_ns": "call_ts_ns"})
    rows = rows.merge(calls, on=["rank", "cpu_event_id"], how="left")
    nested = rows.nested_event_id.notna()
    on_tracks = rows[~nested].merge(times, on=["rank", "event_id"], how="inner")
    # a gloo send or recv is posted by its call (the receiver's ready notice, which releases the sender, leaves
    # during it), before the annotation that times it opens: its arrival is the call's start
    timed = rows[nested]
    timed = timed.assign(ts_ns=np.minimum(timed.nested_start_ns.astype(np.int64),
                                          timed.call_ts_ns.fillna(timed.nested_start_ns).astype(np.int64)),
                         end_ns=timed.nested_end_ns.astype(np.int64))
    rows = pd.concat([on_tracks, timed], ignore_index=True).drop(columns="call_ts_ns")
    rows = rows.sort_values(["match_key", "rank", "ts_ns"], kind="stable").drop_duplicates(["match_key", "rank"])
    lanes = rows[rows.nested_event_id.notna()]
    laneless = pd.DataFrame({"rank": lanes["rank"].astype(np.int64), "event_id": lanes.event_id.astype(np.int64),
                             "call_event_id": lanes.cpu_event_id.astype(np.int64),
                             "name": "gloo:" + lanes.call_op.astype(str), "ts_ns": lanes.ts_ns.astype(np.int64),
                             "end_ns": lanes.end_ns.astype(np.int64), "match_key": lanes.match_key})
    return rows, laneless


def _transfer(agg: pd.DataFrame, rows: pd.DataFrame, spans: dict) -> int:
    """Set each instance's measured transfer window and its participants' early / wake-up lists; returns
    how many instances had a rank finish before the last one arrived."""
    single = agg.n.to_numpy() == 1
    transfer = (agg.first_end_ns - agg.last_arrival_ns).to_numpy(np.int64, na_value=-1)  # no end: inconsistent
    inconsistent = int(((transfer < 0) & ~single).sum())
    transfer = np.maximum(transfer, 0)
    # a lone participant: its whole time counts as the transfer (its peers are not here to wait for)
    transfer[single] = (agg.first_end_ns - agg.first_arrival_ns).to_numpy(np.int64, na_value=0)[single]
    agg["measured_transfer_ns"] = transfer
    agg["barrier_start_ns"] = agg.last_arrival_ns
    # gloo: the caller blocks in wait() and wakes when the collective completes, which the runloop's
    # annotation can outlast by a few ms; the shared transfer window ends at the first sign of
    # completion on any rank: the first annotation end or the first caller's wake-up
    wake, wait_from = _wake_times(rows, agg.last_arrival_ns, spans)
    rows["wake_ns"] = wake
    rows["wait_from_ns"] = wait_from
    # a sender woken says its message left, not that it arrived: only the other participants' wakes end the window
    ends = (wake >= 0) & rows.transfer_end_ns.notna().to_numpy()
    first_wake = rows.assign(w=np.where(ends, wake, np.iinfo(np.int64).max)).groupby("match_key", sort=False).w.min()
    cut = first_wake.to_numpy(np.int64) - agg.last_arrival_ns.to_numpy(np.int64)
    has = first_wake.to_numpy(np.int64) != np.iinfo(np.int64).max
    use = has & (cut >= 0) & ~single & (cut < transfer)
    transfer = np.where(use, cut, transfer)
    agg["measured_transfer_ns"] = transfer
    rel = rows.match_key.map(agg.last_arrival_ns + agg.measured_transfer_ns).to_numpy(np.int64)
    rows["early"] = rows.end_ns.to_numpy(np.int64) < rel
    agg["early"] = rows.groupby("match_key", sort=False).early.agg(list)
    agg["wakes"] = rows.groupby("match_key", sort=False).wake_ns.agg(list)
    agg["wait_from"] = rows.groupby("match_key", sort=False).wait_from_ns.agg(list)
    agg["callers"] = rows.groupby("match_key", sort=False).apply(
        lambda x: list(zip(x["rank"], x.call_pid, x.call_tid)), include_groups=False)
    return inconsistent


def _groups(agg: pd.DataFrame, host_of: dict) -> int:
    """Set each instance's group (ranks, group_size), hosts it spans and peers outside the replayed ranks;
    returns how many instances miss peers."""
    groups, sizes, hosts_n, miss = [], [], [], []
    cache = {}
    for pr, rk, gs, op, src, dst in zip(agg.pg_ranks, agg.present_ranks, agg.group_size, agg.op, agg.p2p_src,
                                        agg.p2p_dst):
        group = [int(x) for x in pr] if pr is not None and len(pr) else [int(x) for x in rk]
        size = len(group) if pd.isna(gs) else int(gs)
        if op in P2P_OPS and not pd.isna(src) and not pd.isna(dst):
            # a send and its recv move the message between their two ranks only: [sender, receiver]
            group, size = [int(src), int(dst)], 2
        key = tuple(group)
        if key not in cache:
            hs = [host_of.get(r) for r in group]
            cache[key] = len(set(hs)) if all(h is not None for h in hs) else pd.NA
        groups.append(group)
        sizes.append(size)
        hosts_n.append(cache[key])
        miss.append(max(0, size - len(rk)))
    agg["ranks"], agg["group_size"], agg["n_hosts"], agg["missing_peers"] = groups, sizes, hosts_n, miss
    return int((np.asarray(miss) > 0).sum())


def waits_by_track(colls: pd.DataFrame, tracks: pd.DataFrame) -> dict:
    """{track: (starts, ends)} of the waits of gloo callers (an idle gap that the collective's completion ended),
    sorted and disjoint: the graph leaves them out of the thread's pieces."""
    tkey = track_keys(tracks)
    spans: dict = {}
    for wakes, began, callers in zip(colls.wakes, colls.wait_from, colls.callers):
        for w, b, (r, pid, tid) in zip(wakes, began, callers):
            if w < 0 or b < 0 or w <= b or pd.isna(pid):
                continue
            t = tkey.get((int(r), int(pid), int(tid)))
            if t is not None:
                spans.setdefault(t, []).append((int(b), int(w)))
    out = {}
    for t, iv in spans.items():
        iv = np.array(sorted(iv), np.int64)
        out[t] = union_spans(iv[:, 0], iv[:, 1])
    return out


WAKE_LEAD_NS = 5_000_000  # a gloo caller wakes up to ~5 ms before the runloop's annotation ends (seen: 0.2-5.3 ms)


def _wake_times(rows: pd.DataFrame, last_arrival: pd.Series, spans: dict):
    """For each gloo participant: when its calling thread woke from the wait, and when that wait began (the idle
    gap's start), -1 when the caller was not waiting. Of the idle gaps (between the thread's working spans)
    inside the collective's window whose end is nearer this collective's completion
    than any other of the rank's collectives' (a wake-up is the collective's that caused it), the one
    covering most of the window among those ending within WAKE_LEAD_NS of the completion or later, or
    covering at least half the window. DDP waits for its buckets one after another once backward ends: a
    later bucket's caller waited through the previous bucket (a gap that ends at that bucket's completion,
    so not this one's) and for the last part of its own; a runloop whose annotation ends more than
    WAKE_LEAD_NS after the caller woke (a worker descheduled on a busy machine) still finds the caller's
    long wait, which is nearer its completion than the previous bucket's."""
    out = np.full(len(rows), -1, np.int64)
    began = np.full(len(rows), -1, np.int64)
    la = rows.match_key.map(last_arrival).to_numpy(np.int64)
    ends = _completion(rows)
    ranks = rows["rank"].to_numpy(np.int64)
    cpu = (rows.timeline == "cpu").to_numpy(bool)
    rank_ends = {int(r): np.sort(ends[(ranks == r) & cpu]) for r in np.unique(ranks[cpu])}
    for i, (tl, r, pid, tid, end) in enumerate(zip(rows.timeline, rows["rank"], rows.call_pid, rows.call_tid, ends)):
        if tl != "cpu" or pd.isna(pid) or pd.isna(tid):
            continue
        sp = spans.get((int(r), int(pid), int(tid)))
        if sp is None or len(sp[0]) < 2:
            continue
        gs, ge = sp
        lo, hi = la[i], int(end)
        window = hi - lo
        if window <= 0:
            continue
        # idle gaps (ge[j], gs[j+1]) that began before the work ended and end after the window opened
        j0 = max(0, np.searchsorted(ge, lo, side="right") - 1)
        j1 = min(np.searchsorted(ge, hi, side="left"), len(gs) - 1)
        js = np.arange(j0, j1)
        js = js[gs[js + 1] > lo]
        if not len(js):
            continue
        wake = gs[js + 1]
        js = js[_nearest_is(wake, hi, rank_ends[int(r)])]
        if not len(js):
            continue
        wake = gs[js + 1]
        covered = np.minimum(wake, hi) - np.maximum(ge[js], lo)
        # or from an idle spell inside the window longer than the lead: the caller sat blocked in the wait, and a
        # worker descheduled for longer than the lead ended its annotation later still (DDP's last bucket: the
        # caller idle 88.7 ms, woken 5.2 ms before the runloop's annotation ended, then 0.35 ms of copies and
        # a 0.5 ms gap that the lead alone took for the wake)
        blocked = covered >= WAKE_LEAD_NS
        ok = (wake >= hi - WAKE_LEAD_NS) | (covered * 2 >= window) | blocked
        if ok.any():
            k = np.argmax(covered[ok])
            out[i], began[i] = wake[ok][k], ge[js[ok][k]]
    return out, began


def _nearest_is(t: np.ndarray, end: int, ends_sorted: np.ndarray) -> np.ndarray:
    """Per time in t: whether `end` is (one of) the nearest of ends_sorted to it."""
    j = np.searchsorted(ends_sorted, t)
    lo = ends_sorted[np.clip(j - 1, 0, len(ends_sorted) - 1)]
    hi = ends_sorted[np.clip(j, 0, len(ends_sorted) - 1)]
    nearest = np.minimum(np.abs(t - lo), np.abs(t - hi))
    return np.abs(t - end) <= nearest


def _completion(rows: pd.DataFrame) -> np.ndarray:
    """When each participant's collective completed on its rank: its end, or for gloo's send and recv, whose
    call returns before the message has gone or come (the caller then blocks in work.wait(), which records
    no event), the end of the gloo annotation that opened inside the call (nested_end_ns)."""
    ends = rows.end_ns.to_numpy(np.int64)
    nested = rows.nested_end_ns.to_numpy("float64", na_value=np.nan)
    return np.where(np.isnan(nested), ends, np.maximum(ends, np.nan_to_num(nested).astype(np.int64)))


def _behind_on_the_pair(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per instance, the gloo message it queued behind on its pair's TCP stream (coll_id, -1: none), and its window
    (barrier start and measured transfer, ns), which starts once that message has arrived. gloo sends a message only
    when the receiver's ready notice has come: the receiver posts its recv and writes the notice into the stream it
    shares with the sender, behind the bytes of any message it is sending the other way. So a recv posted while a
    message of its own was going out waits for that message to arrive before its own can start (1F1B's gradient out
    and activation in: at 50 Mbit/s a 64 KiB activation took 15.4 ms from both ends posted, 8.0 of them its
    gradient's). Not where x's sender completed its send (gloo writes a message once the notice has come) before the
    other message was halfway over: its notice had come, and x ran beside the other message (at 400 Mbit/s a 64 KiB
    activation whose send completed 59 us after its recv was posted, and which arrived 888 us after, 3 us after the
    gradient it would have queued behind: cut there, the links fit took its 3 us for the link's speed). Only for gloo
    (the CPU timeline's) send / recv pairs of one group; the measured window is cut where the other message arrived
    (an unchanged replay stays the run)."""
    out = np.full(len(df), -1, np.int64)
    start = df.barrier_start_ns.to_numpy(np.int64).copy()
    transfer = df.measured_transfer_ns.to_numpy(np.int64).copy()
    p2p = df.op.isin(P2P_OPS).to_numpy() & (df.timeline == "cpu").to_numpy() & (df.group_size == 2).to_numpy()
    if p2p.sum() < 2:
        return out, start, transfer
    end = start + transfer
    src, dst = df.p2p_src.to_numpy(), df.p2p_dst.to_numpy()
    posted = np.full(len(df), np.iinfo(np.int64).min, np.int64)  # when the receiver posted its recv
    sent_at = df.send_end_ns.astype("Int64").to_numpy(np.int64, na_value=np.iinfo(np.int64).min)  # ints: trace times
    for i in np.flatnonzero(p2p):
        at = dict(zip(df.present_ranks.iat[i], df.arrivals.iat[i])).get(dst[i])
        if at is not None:
            posted[i] = int(at)
    by_way: dict = {}
    for i in np.flatnonzero(p2p & (posted > np.iinfo(np.int64).min)):
        by_way.setdefault((df.pg_name.iat[i], int(src[i]), int(dst[i])), []).append(i)
    for (pg, a, b), xs in by_way.items():
        ys = by_way.get((pg, b, a))
        if not ys:
            continue
        ys = np.asarray(ys)
        for x in xs:
            # the other way's messages going out when x's receiver posted, ending inside x's window
            live = ys[(start[ys] <= posted[x]) & (end[ys] > posted[x]) & (end[ys] > start[x]) & (end[ys] < end[x])]
            # unless x's sender sent before the other message was halfway over: its notice had come by then
            if sent_at[x] > np.iinfo(np.int64).min:
                live = live[sent_at[x] >= (start[live] + end[live]) // 2]
            if not len(live):
                continue
            y = live[np.argmax(end[live])]
            out[x] = int(df.coll_id.iat[y])
            start[x], transfer[x] = end[y], end[x] - end[y]
    return out, start, transfer
