"""What a graph of some ranks needs from every rank, and what plans which ranks to build: one linear pass over
the store, no rank's graph built for it.

A graph of the representatives of a folded replay (replay/fold.py) holds every collective instance as the whole
run saw it: its barrier starts when the last of all its participants arrived and lasts the transfer all of them
shared (cut at the first gloo caller's wake-up, any rank's), so the representatives' nodes, edges and lags are
those the graph of every rank gives them. That needs, of the other ranks, only their participants: the events
a participant is made of, and the working spans of the gloo callers' threads (their working leaves, from the
pass that hashes every track: analyses/_graph_rank_shapes.sql, the SQL twin of tracks.working_spans' leaves).
The origin, the steps and the hosts are every rank's as well.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .._sql import query
from ..comms import comm_participants
from ..intervals import union_spans
from ..per_rank import chunks, event_counts, map_chunks
from .collectives import collectives
from .load import _async_annotations_out, _hosts, select_ranks
from .model import WAIT_CALLS


@dataclass
class RunWide:
    """Every rank's part of a graph of some of them (measured times, ns)."""

    ranks: list  # every rank of the store
    origin_ns: int  # the replay's origin: the earliest CPU op, device op or step of any rank
    steps: pd.DataFrame  # every rank's steps (as load.Loaded.steps)
    hosts: pd.DataFrame  # rank, hostname
    comm: pd.DataFrame  # every rank's collective participants (analyses/comm_participants.sql)
    colls: pd.DataFrame  # collectives.COLUMNS over every participant
    members: dict  # {(rank, event_id): coll_id} of every rank
    laneless: pd.DataFrame  # collectives.LANELESS_COLUMNS of every rank
    shapes: pd.DataFrame  # rank_shapes': rank, shape, work_ns
    notes: list = field(default_factory=list)


def rank_shapes(run, comm: pd.DataFrame | None = None, ranks: list | None = None, executor=None) -> pd.DataFrame:
    """Per rank (sorted): `shape`, a key equal for ranks that ran the same events in the same order on the same
    tracks and joined the same collectives, `work_ns`, its measured working time, and `first_ns`, its earliest
    event (analyses/_graph_rank_shapes.sql). comm: every rank's participants (comm_participants), ranks: every
    rank, when already read; executor: the per-rank pass's Dask cluster ('dask://HOST:PORT'), None: this process."""
    ranks = select_ranks(run) if ranks is None else ranks
    comm = comm_participants(run, ranks) if comm is None else comm
    return _shapes(_tracks(run, ranks, executor=executor), comm)


def run_wide(run, comm: pd.DataFrame | None = None, executor=None) -> RunWide:
    """The collective instances over every participant, the origin, the steps, the hosts and the shapes of every
    rank. executor: where the pass over every rank's events runs, in chunks of ranks ('dask://HOST:PORT'; None:
    this process)."""
    ranks = select_ranks(run)
    comm = comm_participants(run, ranks) if comm is None else comm
    hosts = _hosts(run)
    steps = query(run, "_graph_steps", ranks=ranks)
    cpu = _async_annotations_out(query(run, "_graph_comm_cpu", ranks=ranks))
    cpu = cpu.assign(end_ns=cpu.ts_ns + cpu.dur_ns)
    kern = comm[comm.kernel_event_id.notna()]
    gpu = query(run, "_graph_comm_gpu", ranks=ranks, e_rank=kern["rank"].astype(np.int64).tolist(),
                e_id=kern.kernel_event_id.astype(np.int64).tolist())
    gpu = gpu.assign(end_ns=gpu.ts_ns + gpu.dur_ns)
    # the threads that called a collective the CPU ran (gloo's): their working spans are where their waits are found
    calls = comm[(comm.timeline == "cpu") & comm.cpu_event_id.notna()][["rank", "cpu_event_id"]]
    callers = calls.merge(cpu[["rank", "event_id", "pid", "tid"]], left_on=["rank", "cpu_event_id"],
                          right_on=["rank", "event_id"])[["rank", "pid", "tid"]].drop_duplicates()
    tracks = _tracks(run, ranks, callers, executor)
    notes: list = []
    colls, members, laneless = collectives(comm, hosts, notes, cpu, gpu, caller_spans(tracks))
    shapes = _shapes(tracks, comm)
    # the origin every graph of the run's ranks shares: the earliest CPU op, device op or step of any rank
    origin = int(min([shapes.first_ns.min()] + ([steps.ts_ns.min()] if len(steps) else [])))
    return RunWide(ranks=ranks, origin_ns=origin, steps=steps, hosts=hosts, comm=comm, colls=colls, members=members,
                   laneless=laneless, shapes=shapes, notes=notes)


def _tracks(run, ranks, callers: pd.DataFrame | None = None, executor=None) -> pd.DataFrame:
    """analyses/_graph_rank_shapes.sql: per track its hash, working time and first event; the working leaves of the
    callers' threads (rank, pid, tid). A track is one rank's, so the ranks go in chunks of CHUNK_EVENTS events (its
    windows hold every event they order: 82 M at 16,384 ranks), on the Dask cluster of `executor` when given."""
    frames = map_chunks(run, chunks(list(ranks), event_counts(run)), _tracks_of, (callers,), executor=executor,
                        what="the graph's pass over the ranks")
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _tracks_of(run, ranks, callers: pd.DataFrame | None) -> pd.DataFrame:
    if callers is not None:
        callers = callers[callers["rank"].isin(ranks)]
    t = [[] if callers is None else callers[c].astype(np.int64).tolist() for c in ("rank", "pid", "tid")]
    return query(run, "_graph_rank_shapes", ranks=list(ranks), wait_calls=sorted(WAIT_CALLS), t_rank=t[0],
                 t_pid=t[1], t_tid=t[2])


def _shapes(tracks: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """rank_shapes' columns from the tracks (in the graph's order) and the collectives each rank joined."""
    joined = comm.groupby("rank").match_key.agg(lambda k: "\x00".join(sorted(map(str, k)))) if len(comm) else {}
    rows = []
    for r, tr in tracks.groupby("rank", sort=True):
        h = hashlib.sha1(",".join(str(int(x)) for x in tr.h).encode())
        h.update(str(joined.get(int(r), "")).encode())
        rows.append((int(r), h.hexdigest(), int(tr.work_ns.sum()), int(tr.first_ns.min())))
    return pd.DataFrame(rows, columns=["rank", "shape", "work_ns", "first_ns"])


def caller_spans(tracks: pd.DataFrame) -> dict:
    """{(rank, pid, tid): (starts, ends)}: the working spans (tracks.working_spans) of the threads _tracks was given,
    from their working leaves."""
    out = {}
    for r, pid, tid, ts, end in zip(tracks["rank"], tracks.pid, tracks.tid, tracks.leaf_ts, tracks.leaf_end):
        if ts is None or (not isinstance(ts, np.ndarray) and pd.isna(ts)):
            continue
        ts, end = np.asarray(ts, np.int64), np.asarray(end, np.int64)
        o = np.lexsort((-end, ts))  # the order working_spans unions them in: start, longest first
        out[(int(r), int(pid), int(tid))] = union_spans(ts[o], end[o])
    return out
