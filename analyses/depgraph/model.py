"""The graph's arrays (`Graph`), its node and edge kinds, and the append-only builder the other modules
of the package add nodes and edges through (`Builder`, with the `NodeMap` from events to nodes)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.store.devices import RUNTIME_CATEGORIES

KINDS = ("origin", "cpu", "runtime", "sync", "sync_exit", "gpu", "comm", "comm_exit", "barrier")
K = {k: i for i, k in enumerate(KINDS)}
EDGE_KINDS = ("origin", "thread", "stream", "launch", "event_wait", "sync", "enqueue", "host_wait",
              "arrive", "release", "posted", "pair_order")
E = {k: i for i, k in enumerate(EDGE_KINDS)}

SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
    "hipEventSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol",
    "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "hipMemcpy"})
# calls that block their thread until a collective's work is done: the thread waits in them, it does not compute
# (functional collectives and DTensor wait with wait_tensor; Work.wait() from Python records no event at all)
WAIT_CALLS = frozenset({"_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"})
RUNTIME_CATS = RUNTIME_CATEGORIES  # the launches of device ops, on every accelerator (tracekit/store/devices.py)


@dataclass
class Graph:
    """Arrays of nodes and edges (numpy, one entry per node / edge) and the tables the models read."""

    kind: np.ndarray  # int8 index into KINDS
    rank: np.ndarray  # int64 (-1: origin, barrier)
    track: np.ndarray  # int64 index into tracks (-1: origin, barrier)
    event_id: np.ndarray  # int64 the event the node belongs to (-1: none)
    start_ns: np.ndarray  # int64 measured start
    dur_ns: np.ndarray  # int64 measured duration (barrier: the measured transfer)
    coll: np.ndarray  # int64 collective instance of comm / comm_exit / barrier nodes (-1: none)
    name: np.ndarray  # object
    src: np.ndarray  # int64
    dst: np.ndarray  # int64
    from_end: np.ndarray  # bool: released at the source's end (else at its start)
    edge_kind: np.ndarray  # int8 index into EDGE_KINDS
    lag_ns: np.ndarray  # int64
    tracks: pd.DataFrame  # track, rank, pid, tid, is_gpu, main (the rank's busiest CPU thread)
    colls: pd.DataFrame  # one row per collective instance: the communication model's input
    steps: pd.DataFrame  # rank, step, pid, tid, ts_ns, end_ns, is_last (measured)
    ranks: list
    origin_ns: int
    notes: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    # rank, hostname: the host each rank ran on (run.json's label, else the trace's host_name)
    hosts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"rank": [], "hostname": []}))

    @property
    def n_nodes(self) -> int:
        return len(self.kind)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    def nodes(self) -> pd.DataFrame:
        """One row per node, the duration models' input: node_id, rank, kind, name, track, stream (GPU),
        gpu_kind (kernel | memcpy | memset), kernel_class (compute | communication | memory | other),
        start_ns, dur_ns (measured)."""
        from ..kernel_classes import classify

        kind = np.asarray(KINDS, dtype=object)[self.kind]
        n = len(kind)
        tr_gpu = self.tracks.is_gpu.to_numpy(bool)
        tr_tid = self.tracks.tid.to_numpy(np.int64)
        has = self.track >= 0
        on_gpu = np.zeros(n, bool)
        on_gpu[has] = tr_gpu[self.track[has]]
        stream = pd.array(np.where(on_gpu, tr_tid[np.where(has, self.track, 0)], 0), dtype="Int64")
        stream[~on_gpu] = pd.NA
        gpu_kind = np.full(n, None, dtype=object)
        classes = np.full(n, None, dtype=object)
        cache: dict = {}
        for i in np.flatnonzero(on_gpu & np.isin(kind, ("gpu", "comm", "comm_exit"))):
            nm = self.name[i]
            hit = cache.get(nm)
            if hit is None:
                gk = "memcpy" if nm.startswith("Memcpy") else "memset" if nm.startswith("Memset") else "kernel"
                hit = cache[nm] = (gk, "memory" if gk != "kernel" else classify(nm))
            gpu_kind[i], classes[i] = hit
        return pd.DataFrame({"node_id": np.arange(n, dtype=np.int64), "rank": self.rank, "kind": kind,
                             "name": self.name, "track": self.track, "stream": stream, "gpu_kind": gpu_kind,
                             "kernel_class": classes, "start_ns": self.start_ns, "dur_ns": self.dur_ns})

    def edges(self) -> pd.DataFrame:
        return pd.DataFrame({"src": self.src, "dst": self.dst, "from_end": self.from_end,
                             "kind": np.asarray(EDGE_KINDS, dtype=object)[self.edge_kind], "lag_ns": self.lag_ns})


@dataclass
class NodeMap:
    """Where events went in the graph, shared by the tracks, the collectives and the edges.

    role:    (rank, event_id) -> ("sync", -1) | ("comm", coll_id): the events that become an instant and an exit
    first:   (rank, event_id) -> the event's first node (its first piece on a CPU thread)
    exit_of: entry node of a sync call or collective participant -> its exit node
    """

    role: dict = field(default_factory=dict)
    first: dict = field(default_factory=dict)
    exit_of: dict = field(default_factory=dict)


class Builder:
    """Append-only node and edge lists."""

    def __init__(self):
        self.parts: list[dict] = []
        self.n = 0
        self.edges: list[tuple] = []

    def add(self, kind, rank, track, event_id, start_ns, dur_ns, name, coll=-1) -> np.ndarray:
        kind = np.asarray(kind, np.int8)
        m = len(np.atleast_1d(start_ns))
        shape = (m,)
        self.parts.append({
            "kind": np.broadcast_to(kind, shape).copy(),
            "rank": np.broadcast_to(np.asarray(rank, np.int64), shape).copy(),
            "track": np.broadcast_to(np.asarray(track, np.int64), shape).copy(),
            "event_id": np.broadcast_to(np.asarray(event_id, np.int64), shape).copy(),
            "start_ns": np.broadcast_to(np.asarray(start_ns, np.int64), shape).copy(),
            "dur_ns": np.broadcast_to(np.asarray(dur_ns, np.int64), shape).copy(),
            "coll": np.broadcast_to(np.asarray(coll, np.int64), shape).copy(),
            "name": np.broadcast_to(np.asarray(name, dtype=object), shape).copy(),
        })
        ids = np.arange(self.n, self.n + m, dtype=np.int64)
        self.n += m
        return ids

    def link(self, src, dst, from_end, kind) -> None:
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        if len(src):
            self.edges.append((src, dst, np.broadcast_to(np.asarray(from_end, bool), src.shape).copy(),
                               np.full(len(src), E[kind], np.int8)))

    def has_incoming(self) -> np.ndarray:
        """Per node so far: whether an edge ends at it."""
        out = np.zeros(self.n, bool)
        for e in self.edges:
            out[e[1]] = True
        return out

    def arrays(self):
        nodes = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        edges = tuple(np.concatenate([e[i] for e in self.edges]) if self.edges else np.zeros(0, dt)
                      for i, dt in enumerate((np.int64, np.int64, bool, np.int8)))
        return nodes, edges
