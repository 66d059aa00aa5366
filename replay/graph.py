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
              the `comm_exit` node after it is where the collective finished on that rank
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
              the collective finished (it blocked in work.wait())
  arrive      participant arrival -> barrier;   release  barrier end -> each participant's exit

Every node keeps its measured duration. The time between a node becoming ready (its last dependency
met, on the measured times) and its measured start is kept as the `lag_ns` of that binding dependency:
CPU gaps between ops, launch latency, GPU scheduling gaps, wake-up after a sync. Other dependencies get
lag 0. A replay with measured durations, lags and transfers therefore reproduces the measured run when
the graph holds no false dependency; a what-if changes durations and transfers and lets the
dependencies decide what moves. Inferred dependencies (event_wait, sync, enqueue, host_wait) that the
measurements contradict are dropped and counted in `notes`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.errors import TracekitError

KINDS = ("origin", "cpu", "runtime", "sync", "sync_exit", "gpu", "comm", "comm_exit", "barrier")
K = {k: i for i, k in enumerate(KINDS)}
EDGE_KINDS = ("origin", "thread", "stream", "launch", "event_wait", "sync", "enqueue", "host_wait",
              "arrive", "release")
E = {k: i for i, k in enumerate(EDGE_KINDS)}
_SOFT = np.array([k in ("event_wait", "sync", "enqueue", "host_wait") for k in EDGE_KINDS])

SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
    "hipEventSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol",
    "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "hipMemcpy"})
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


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
    hosts: pd.DataFrame  # rank, hostname: the host each rank ran on (run.json's label, else the trace's host_name)
    colls: pd.DataFrame  # one row per collective instance: the communication model's input
    steps: pd.DataFrame  # rank, step, pid, tid, ts_ns, end_ns, is_last (measured)
    ranks: list
    origin_ns: int
    notes: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)

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
        from analyses.kernel_classes import classify

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


class _Nodes:
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

    def arrays(self):
        nodes = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        edges = tuple(np.concatenate([e[i] for e in self.edges]) if self.edges else np.zeros(0, dt)
                      for i, dt in enumerate((np.int64, np.int64, bool, np.int8)))
        return nodes, edges


def build(run, ranks=None) -> Graph:
    """The dependency graph of the run's ranks (default: all of them)."""
    all_ranks = [int(r) for r in run.sql("SELECT rank FROM ranks ORDER BY rank")["rank"]]
    if not all_ranks:
        raise TracekitError(f"{run.store.path}: the store has no ranks to replay")
    if ranks is None:
        ranks = all_ranks
    else:
        ranks = sorted({int(r) for r in ranks})
        missing = [r for r in ranks if r not in all_ranks]
        if missing:
            raise TracekitError(f"--ranks: rank(s) {', '.join(map(str, missing))} not in the store "
                                f"(it has ranks {_span(all_ranks)})")
    data = _load(run, ranks)
    return _assemble(data, ranks)


def _span(ranks) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 3 else ", ".join(map(str, ranks))


def _load(run, ranks) -> dict:
    import tracekit.comms as comms

    p = {"ranks": ranks}
    in_ranks = "rank IN (SELECT unnest($ranks::BIGINT[]))"
    out = {
        "cpu": run.sql(f"""
            SELECT rank, pid, tid, event_id, cat, name, ts_ns, dur_ns, correlation FROM _events
            WHERE {in_ranks} AND ph = 'X' AND dur_ns IS NOT NULL AND ts_ns IS NOT NULL
              AND pid IS NOT NULL AND tid IS NOT NULL AND dur_ns >= 0
              AND (cat IN ('cpu_op', 'cuda_runtime', 'cuda_driver')
                   OR (cat = 'user_annotation' AND (name LIKE 'gloo:%' OR name LIKE 'nccl:%')))""", p),
        "gpu": run.sql(f"""
            SELECT rank, pid, tid, event_id, name, ts_ns, dur_ns, correlation FROM _events
            WHERE {in_ranks} AND ph = 'X' AND cat IN {_GPU_CATS} AND dur_ns IS NOT NULL AND dur_ns >= 0
              AND ts_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL""", p),
        "cuda_sync": run.sql(f"""
            SELECT rank, correlation, name,
                   TRY_CAST(json_extract_string(args_json, '$.stream') AS BIGINT) AS stream,
                   TRY_CAST(json_extract_string(args_json, '$.wait_on_stream') AS BIGINT) AS wait_on_stream
            FROM _events WHERE {in_ranks} AND cat = 'cuda_sync' AND correlation IS NOT NULL""", p),
        "steps": run.sql(f"""
            SELECT rank, step, pid, tid, ts_ns, end_ns, is_last FROM steps WHERE {in_ranks}
            ORDER BY rank, step""", p),
        "hosts": _hosts(run),
    }
    comms.prepare(run)
    out["comm"] = run.sql(f"""
        SELECT r.rank, r.match_key, r.op, r.bytes, r.group_size, r.pg_name, r.pg_ranks, r.timeline,
               r.cpu_event_id, r.cpu_tid, r.kernel_event_id, p.event_id AS runloop_event_id
        FROM _comm_trace_rows r
        LEFT JOIN _comm_loose_pairs p ON p.rank = r.rank AND p.call_event_id = r.cpu_event_id
        WHERE r.{in_ranks} AND r.timeline IN ('gpu', 'cpu')
        ORDER BY r.match_key, r.rank""", p)
    return out


def _hosts(run) -> pd.DataFrame:
    """rank -> host. Testbed namespaces share the machine's hostname, so run.json's per-rank `host`
    label, when there is one, names the host a rank ran on."""
    hosts = run.sql("SELECT rank, hostname FROM ranks ORDER BY rank")
    label = {int(r["rank"]): r["host"] for r in run.run_manifest().get("ranks") or []
             if isinstance(r, dict) and r.get("host") is not None and r.get("rank") is not None}
    if label:
        hosts["hostname"] = [label.get(int(r), h) for r, h in zip(hosts["rank"], hosts.hostname)]
    return hosts


def _assemble(d: dict, ranks) -> Graph:
    cpu, gpu, steps = d["cpu"], d["gpu"], d["steps"]
    if cpu.empty and gpu.empty:
        raise TracekitError("no CPU ops, runtime calls or GPU ops with durations in the selected ranks: "
                            "nothing to replay")
    notes: list[str] = []
    cpu = cpu.assign(end_ns=cpu.ts_ns + cpu.dur_ns)
    gpu = gpu.assign(end_ns=gpu.ts_ns + gpu.dur_ns)
    # the origin precedes every node and every step annotation (a step can open before its first op)
    t0 = int(min(x.ts_ns.min() for x in (cpu, gpu, steps) if len(x)))

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

    colls, members = _collectives(d["comm"], d["hosts"], notes, cpu, gpu, _busy_spans(cpu) if len(cpu) else {})
    role = {}  # (rank, event_id) -> ("sync", -1) | ("comm", coll_id)
    for r, e, n in zip(cpu["rank"].to_numpy(), cpu.event_id.to_numpy(), cpu.name.to_numpy()):
        if n in SYNC_CALLS:
            role[(int(r), int(e))] = ("sync", -1)
    for (r, e), c in members.items():
        role[(r, e)] = ("comm", c)

    nb = _Nodes()
    origin = nb.add(K["origin"], -1, -1, -1, [t0], [0], "origin")[0]
    first, last, exit_of = {}, {}, {}
    chains = []
    multi = 0
    for t, g in cpu.groupby("track", sort=True):
        ids, m = _cpu_track(nb, int(t), g, role, first, last, exit_of)
        chains.append((ids, False))
        multi += m
    for t, g in gpu.groupby("track", sort=True):
        chains.append((_gpu_track(nb, int(t), g, role, first, last, exit_of), True))
    if multi:
        notes.append(f"{multi} collective or sync call(s) span several CPU pieces: replayed with their measured time")

    bar_ids = {}
    if len(colls):
        ids = nb.add(K["barrier"], -1, -1, -1, colls.barrier_start_ns.to_numpy(np.int64),
                     colls.measured_transfer_ns.to_numpy(np.int64), colls.op.astype(object).to_numpy(),
                     colls.coll_id.to_numpy(np.int64))
        bar_ids = dict(zip(colls.coll_id.astype(int), ids.tolist()))

    for ids, is_gpu in chains:
        nb.link([origin], ids[:1], True, "origin")
        nb.link(ids[:-1], ids[1:], True, "stream" if is_gpu else "thread")

    nodes, _ = nb.arrays()
    counts = {}
    if len(gpu) and len(cpu):
        counts.update(_launch_and_sync_edges(nb, nodes, cpu, gpu, d["cuda_sync"], first, exit_of))
    if len(colls):
        counts.update(_collective_edges(nb, nodes, colls, d["comm"], tracks, first, exit_of, bar_ids, chains))

    nodes, (src, dst, from_end, ekind) = nb.arrays()
    g = Graph(kind=nodes["kind"], rank=nodes["rank"], track=nodes["track"], event_id=nodes["event_id"],
              start_ns=nodes["start_ns"], dur_ns=nodes["dur_ns"], coll=nodes["coll"], name=nodes["name"],
              src=src, dst=dst, from_end=from_end, edge_kind=ekind, lag_ns=np.zeros(len(src), np.int64),
              tracks=tracks, hosts=d["hosts"], colls=colls, steps=steps, ranks=list(ranks), origin_ns=t0, notes=notes,
              stats=counts)
    _bind_lags(g)
    return g


def _top_level(ts: np.ndarray, end: np.ndarray):
    """Busy spans of a thread: (starts, ends) of its top-level groups of events (ts sorted)."""
    run_end = np.maximum.accumulate(end)
    new = np.ones(len(ts), bool)
    new[1:] = ts[1:] >= run_end[:-1]
    heads = np.flatnonzero(new)
    return ts[heads], np.maximum.reduceat(end, heads)


def _busy_spans(cpu: pd.DataFrame) -> dict:
    """{(rank, pid, tid): (starts, ends)} of every CPU thread's busy spans."""
    out = {}
    for key, g in cpu.sort_values(["rank", "pid", "tid", "ts_ns"], kind="stable").groupby(["rank", "pid", "tid"], sort=False):
        out[tuple(int(k) for k in key)] = _top_level(g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64))
    return out


def _cpu_track(nb: _Nodes, track: int, g: pd.DataFrame, role, first, last, exit_of):
    """Cut a thread's busy time into pieces at every special event's start and end; a sync call or a
    collective participant that is a single piece becomes an instant followed by its exit node."""
    g = g.sort_values(["ts_ns", "end_ns", "event_id"], ascending=[True, False, True], kind="stable")
    ts, end, eid = g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64), g.event_id.to_numpy(np.int64)
    names = g.name.to_numpy(object)
    cat = g.cat.to_numpy(object)
    special = np.isin(cat, _RUNTIME_CATS) | (cat == "user_annotation") | np.char.startswith(names.astype(str), "c10d::")
    gs, ge = _top_level(ts, end)
    pts = np.unique(np.concatenate([gs, ge, ts[special], end[special]]))
    a, z = pts[:-1], pts[1:]
    inside = np.searchsorted(gs, a, side="right") - 1
    keep = (inside >= 0) & (z <= ge[np.maximum(inside, 0)])
    a, z = a[keep], z[keep]
    zero = end == ts  # zero-length events get a zero-length piece of their own (launches can be 0 ns)
    zero &= special
    if zero.any():
        a = np.concatenate([a, ts[zero]])
        z = np.concatenate([z, ts[zero]])
        order = np.lexsort((z, a))
        a, z = a[order], z[order]
    owner = _owners(ts, end, np.arange(len(ts)), a, z)
    rank = int(g["rank"].iat[0])
    kind = np.where(owner >= 0, np.where(np.isin(cat[np.maximum(owner, 0)], _RUNTIME_CATS), K["runtime"], K["cpu"]),
                    K["cpu"]).astype(np.int8)
    piece_event = np.where(owner >= 0, eid[np.maximum(owner, 0)], -1)
    piece_name = np.where(owner >= 0, names[np.maximum(owner, 0)], "cpu").astype(object)
    # special events -> their first and last piece
    sp = np.flatnonzero(special)
    f = np.searchsorted(a, ts[sp], side="left")
    lz = np.searchsorted(z, end[sp], side="right") - 1
    # pieces that turn into (instant, exit) pairs
    exits = {}  # piece index -> its role: ("sync", -1) or ("comm", collective id)
    multi = 0
    for k, i in enumerate(sp):
        r = role.get((rank, int(eid[i])))
        if r is None:
            continue
        if f[k] != lz[k]:
            multi += 1
            continue
        exits[int(f[k])] = r
    n = len(a)
    extra = len(exits)
    total = n + extra
    # layout: piece j goes to slot j + (number of exits before j); its exit right after it
    before = np.zeros(n, np.int64)
    if extra:
        marks = np.zeros(n, np.int64)
        marks[list(exits)] = 1
        before = np.concatenate([[0], np.cumsum(marks)[:-1]])
    slot = np.arange(n) + before
    kinds = np.empty(total, np.int8)
    starts = np.empty(total, np.int64)
    durs = np.empty(total, np.int64)
    evs = np.empty(total, np.int64)
    nms = np.empty(total, object)
    colls = np.full(total, -1, np.int64)
    kinds[slot], starts[slot], durs[slot], evs[slot], nms[slot] = kind, a, z - a, piece_event, piece_name
    for j, (what, c) in exits.items():
        s = slot[j]
        kinds[s] = K["sync"] if what == "sync" else K["comm"]
        kinds[s + 1] = K["sync_exit"] if what == "sync" else K["comm_exit"]
        starts[s + 1], durs[s + 1] = z[j], 0
        durs[s] = 0
        evs[s + 1], nms[s + 1] = evs[s], nms[s]
        colls[s] = colls[s + 1] = c
    ids = nb.add(kinds, rank, track, evs, starts, durs, nms, colls)
    for k, i in enumerate(sp):
        key = (rank, int(eid[i]))
        first[key] = int(ids[slot[f[k]]])
        last[key] = int(ids[slot[lz[k]]])
        if int(f[k]) in exits and f[k] == lz[k]:
            exit_of[int(ids[slot[f[k]]])] = int(ids[slot[f[k]] + 1])
            last[key] = int(ids[slot[f[k]] + 1])
    return ids, multi


def _gpu_track(nb: _Nodes, track: int, g: pd.DataFrame, role, first, last, exit_of):
    g = g.sort_values(["ts_ns", "event_id"], kind="stable")
    rank = int(g["rank"].iat[0])
    ev = g.event_id.to_numpy(np.int64)
    is_comm = np.array([role.get((rank, int(e)), ("", -1))[0] == "comm" for e in ev], bool)
    n, extra = len(ev), int(is_comm.sum())
    before = np.concatenate([[0], np.cumsum(is_comm)[:-1]]) if n else np.zeros(0, np.int64)
    slot = np.arange(n) + before
    total = n + extra
    kinds = np.full(total, K["gpu"], np.int8)
    starts = np.empty(total, np.int64)
    durs = np.empty(total, np.int64)
    evs = np.empty(total, np.int64)
    nms = np.empty(total, object)
    colls = np.full(total, -1, np.int64)
    ts, end = g.ts_ns.to_numpy(np.int64), g.end_ns.to_numpy(np.int64)
    starts[slot], durs[slot], evs[slot], nms[slot] = ts, end - ts, ev, g.name.to_numpy(object)
    for j in np.flatnonzero(is_comm):
        s = slot[j]
        c = role[(rank, int(ev[j]))][1]
        kinds[s], kinds[s + 1] = K["comm"], K["comm_exit"]
        durs[s] = 0
        starts[s + 1], durs[s + 1], evs[s + 1], nms[s + 1] = end[j], 0, ev[j], nms[s]
        colls[s] = colls[s + 1] = c
    ids = nb.add(kinds, rank, track, evs, starts, durs, nms, colls)
    for j in range(n):
        key = (rank, int(ev[j]))
        first[key] = int(ids[slot[j]])
        last[key] = int(ids[slot[j] + (1 if is_comm[j] else 0)])
        if is_comm[j]:
            exit_of[int(ids[slot[j]])] = int(ids[slot[j] + 1])
    return ids


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


def _collectives(rows: pd.DataFrame, hosts: pd.DataFrame, notes: list, cpu: pd.DataFrame, gpu: pd.DataFrame,
                 spans: dict):
    """One row per collective instance (the communication model's input) and its participants' events:
    {(rank, event_id): coll_id}. A participant's measured time splits into its wait (until the last
    participant arrived) and the transfer (from then to the first finish, which every rank shares)."""
    cols = ["coll_id", "match_key", "op", "bytes", "group_size", "ranks", "n_hosts", "pg_name", "timeline",
            "measured_transfer_ns", "first_arrival_ns", "last_arrival_ns", "barrier_start_ns", "order",
            "present_ranks", "events", "arrivals", "early", "missing_peers", "wakes", "callers"]
    if rows.empty:
        return pd.DataFrame(columns=cols), {}
    ev = rows.runloop_event_id.where(rows.timeline == "cpu")
    ev = ev.fillna(rows.kernel_event_id.where(rows.timeline == "gpu")).fillna(rows.cpu_event_id)
    rows = rows.assign(event_id=ev).dropna(subset=["event_id"])
    rows["event_id"] = rows.event_id.astype(np.int64)
    times = pd.concat([cpu[["rank", "event_id", "ts_ns", "end_ns"]], gpu[["rank", "event_id", "ts_ns", "end_ns"]]])
    rows = rows.merge(times, on=["rank", "event_id"], how="inner")
    rows = rows.sort_values(["match_key", "rank", "ts_ns"], kind="stable").drop_duplicates(["match_key", "rank"])
    calls = cpu[["rank", "event_id", "pid", "tid"]].rename(columns={"event_id": "cpu_event_id", "pid": "call_pid",
                                                                    "tid": "call_tid"})
    rows = rows.merge(calls, on=["rank", "cpu_event_id"], how="left")
    if rows.empty:
        return pd.DataFrame(columns=cols), {}
    host_of = dict(zip(hosts["rank"].astype(int), hosts.hostname))
    rows = rows.sort_values(["match_key", "rank"], kind="stable").reset_index(drop=True)
    grp = rows.groupby("match_key", sort=False)
    agg = grp.agg(first_arrival_ns=("ts_ns", "min"), last_arrival_ns=("ts_ns", "max"), first_end_ns=("end_ns", "min"),
                  n=("rank", "size"), op=("op", "first"), bytes=("bytes", "max"), group_size=("group_size", "first"),
                  pg_name=("pg_name", "first"), timeline=("timeline", "first"),
                  present_ranks=("rank", list), events=("event_id", list), arrivals=("ts_ns", list))
    agg["pg_ranks"] = grp.pg_ranks.first()
    single = agg.n.to_numpy() == 1
    transfer = (agg.first_end_ns - agg.last_arrival_ns).to_numpy(np.int64)
    inconsistent = int(((transfer < 0) & ~single).sum())
    transfer = np.maximum(transfer, 0)
    # a lone participant: its whole time counts as the transfer (its peers are not here to wait for)
    transfer[single] = (agg.first_end_ns - agg.first_arrival_ns).to_numpy(np.int64)[single]
    agg["measured_transfer_ns"] = transfer
    agg["barrier_start_ns"] = agg.last_arrival_ns
    # gloo: the caller blocks in wait() and wakes when the collective completes, which the runloop's
    # annotation can outlast by a few ms; the shared transfer window ends at the first sign of
    # completion on any rank: the first annotation end or the first caller's wake-up
    wake = _wake_times(rows, agg.last_arrival_ns, spans)
    rows["wake_ns"] = wake
    first_wake = rows.assign(w=np.where(wake >= 0, wake, np.iinfo(np.int64).max)).groupby("match_key", sort=False).w.min()
    cut = first_wake.to_numpy(np.int64) - agg.last_arrival_ns.to_numpy(np.int64)
    has = first_wake.to_numpy(np.int64) != np.iinfo(np.int64).max
    use = has & (cut >= 0) & ~single & (cut < transfer)
    transfer = np.where(use, cut, transfer)
    agg["measured_transfer_ns"] = transfer
    rel = rows.match_key.map(agg.last_arrival_ns + agg.measured_transfer_ns).to_numpy(np.int64)
    rows["early"] = rows.end_ns.to_numpy(np.int64) < rel
    agg["early"] = rows.groupby("match_key", sort=False).early.agg(list)
    agg["wakes"] = rows.groupby("match_key", sort=False).wake_ns.agg(list)
    agg["callers"] = rows.groupby("match_key", sort=False).apply(
        lambda x: list(zip(x["rank"], x.call_pid, x.call_tid)), include_groups=False)
    groups, sizes, hosts_n, miss = [], [], [], []
    cache = {}
    for pr, rk, gs in zip(agg.pg_ranks, agg.present_ranks, agg.group_size):
        group = [int(x) for x in pr] if pr is not None and len(pr) else [int(x) for x in rk]
        size = len(group) if pd.isna(gs) else int(gs)
        key = tuple(group)
        if key not in cache:
            hs = [host_of.get(r) for r in group]
            cache[key] = len(set(hs)) if all(h is not None for h in hs) else pd.NA
        groups.append(group)
        sizes.append(size)
        hosts_n.append(cache[key])
        miss.append(max(0, size - len(rk)))
    agg["ranks"], agg["group_size"], agg["n_hosts"], agg["missing_peers"] = groups, sizes, hosts_n, miss
    missing = int((np.asarray(miss) > 0).sum())
    df = agg.reset_index()
    df = df.sort_values(["first_arrival_ns", "match_key"], kind="stable").reset_index(drop=True)
    df.insert(0, "coll_id", np.arange(len(df), dtype=np.int64))
    df["order"] = np.arange(len(df), dtype=np.int64)
    members = {}
    df["bytes"] = df["bytes"].astype("Int64")
    df["n_hosts"] = df["n_hosts"].astype("Int64")
    for c, rks, evs in zip(df.coll_id, df.present_ranks, df.events):
        for r, e in zip(rks, evs):
            members[(int(r), int(e))] = int(c)
    if inconsistent:
        notes.append(f"{inconsistent} collective(s) had a rank finish before the last one arrived (a tree or "
                     "broadcast that released it early, or unaligned clocks): no shared transfer window, the "
                     "early ranks keep their measured time")
    if missing:
        notes.append(f"{missing} collective(s) have peers outside the replayed ranks: their arrival is taken from "
                     "the measured wait (the present ranks' waits are kept inside the transfer time)")
    return df[cols], members


def _wake_times(rows: pd.DataFrame, last_arrival: pd.Series, spans: dict) -> np.ndarray:
    """For each gloo participant: when its calling thread woke from the wait (the end of the idle gap that
    covers most of the transfer window), -1 when the caller did not sit idle through it."""
    out = np.full(len(rows), -1, np.int64)
    la = rows.match_key.map(last_arrival).to_numpy(np.int64)
    for i, (tl, r, pid, tid, end) in enumerate(zip(rows.timeline, rows["rank"], rows.call_pid, rows.call_tid,
                                                   rows.end_ns)):
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
        # idle gaps (ge[j], gs[j+1]) overlapping the window; the one covering most of it
        j0 = max(0, np.searchsorted(ge, lo, side="right") - 1)
        j1 = np.searchsorted(gs, hi, side="right")
        best, best_j = 0, -1
        for j in range(j0, min(j1, len(gs) - 1)):
            ov = min(gs[j + 1], hi) - max(ge[j], lo)
            if ov > best:
                best, best_j = ov, j
        if best_j >= 0 and best * 2 >= window:
            out[i] = gs[best_j + 1]
    return out


def _launch_and_sync_edges(nb: _Nodes, nodes, cpu, gpu, cuda_sync, first, exit_of) -> dict:
    """launch -> GPU op; last awaited GPU op -> sync return; cudaEventRecord/cudaStreamWaitEvent pairs."""
    counts = {}
    rt = cpu[cpu.cat.isin(_RUNTIME_CATS)].sort_values(["rank", "tid", "ts_ns", "event_id"], kind="stable")
    ops = gpu.copy()
    ops["node"] = [first[(int(r), int(e))] for r, e in zip(ops["rank"], ops.event_id)]
    ops["stream"] = ops.tid
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
        s = first[(int(r), int(ev))]
        src.append(s)
        dst.append(int(n))
        launch_of[int(n)] = s
        launch_ts[k] = nodes["start_ns"][s]
    nb.link(src, dst, False, "launch")
    counts["launch"] = len(src)
    ops["launch_ts"] = launch_ts
    ops["launch_event"] = [-1 if s is None else int(nodes["event_id"][s]) for s in (launch_of.get(int(n)) for n in ops.node)]

    # sync return <- the last GPU op it waited for (its stream when cuda_sync says which)
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
            piece = first.get((int(r), int(ev)))
            x = exit_of.get(piece)
            if x is None:
                continue
            # a blocking memcpy waits for its own copy
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
    counts["sync"] = len(s_src)
    counts["event_wait"] = _event_wait_edges(nb, rt, ops, cuda_sync)
    return counts


def _event_wait_edges(nb: _Nodes, rt, ops, cuda_sync) -> int:
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


def _collective_edges(nb: _Nodes, nodes, colls, rows, tracks, first, exit_of, bar_ids, chains) -> dict:
    """arrive / release around each barrier; gloo enqueue and host waits."""
    a_src, a_dst, r_src, r_dst = [], [], [], []
    for c, rks, evs, early in zip(colls.coll_id, colls.present_ranks, colls.events, colls.early):
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
    nb.link(a_src, a_dst, False, "arrive")
    nb.link(r_src, r_dst, True, "release")
    # gloo: the call enqueues the runloop's work; a caller that sat idle through the transfer blocked in
    # wait() and woke when the collective completed: the barrier's end -> its first op after the wake
    loose = rows[rows.runloop_event_id.notna() & rows.cpu_event_id.notna()]
    q_src, q_dst, w_src, w_dst = [], [], [], []
    for r, call, loop in zip(loose["rank"].astype(int), loose.cpu_event_id.astype(np.int64),
                             loose.runloop_event_id.astype(np.int64)):
        cf, lf = first.get((r, int(call))), first.get((r, int(loop)))
        if cf is not None and lf is not None:
            q_src.append(cf)
            q_dst.append(lf)
    track, start = nodes["track"], nodes["start_ns"]
    chain_of = {}
    for ids, is_gpu in chains:
        if not is_gpu and len(ids):
            chain_of[int(track[ids[0]])] = ids
    tkey = {(int(r), int(p), int(t)): int(k) for r, p, t, k in zip(tracks["rank"], tracks.pid, tracks.tid, tracks.track)}
    for c, wakes, callers in zip(colls.coll_id, colls.wakes, colls.callers):
        for w, (r, pid, tid) in zip(wakes, callers):
            if w < 0 or pd.isna(pid):
                continue
            ids = chain_of.get(tkey.get((int(r), int(pid), int(tid)), -1))
            if ids is None:
                continue
            j = np.searchsorted(start[ids], int(w), side="left")
            if j < len(ids) and start[ids[j]] == int(w):
                w_src.append(bar_ids[int(c)])
                w_dst.append(int(ids[j]))
    nb.link(q_src, q_dst, False, "enqueue")
    nb.link(w_src, w_dst, True, "host_wait")
    return {"arrive": len(a_src), "release": len(r_src), "enqueue": len(q_src), "host_wait": len(w_src)}


def _bind_lags(g: Graph) -> None:
    """Give each node's binding dependency (the one satisfied last, on measured times) the measured
    ready-to-start lag; drop inferred dependencies the measurements contradict."""
    start, dur = g.start_ns, g.dur_ns
    if g.n_edges == 0:
        return
    ready = np.where(g.from_end, start[g.src] + dur[g.src], start[g.src])
    slack = start[g.dst] - ready
    contradicted = (slack < 0) & _SOFT[g.edge_kind]
    if contradicted.any():
        dropped = np.bincount(g.edge_kind[contradicted], minlength=len(EDGE_KINDS))
        g.notes.append("dropped inferred dependencies the measured times contradict: " + ", ".join(
            f"{EDGE_KINDS[k]} {n}" for k, n in enumerate(dropped) if n))
        keep = ~contradicted
        g.src, g.dst, g.from_end, g.edge_kind = g.src[keep], g.dst[keep], g.from_end[keep], g.edge_kind[keep]
        ready, slack = ready[keep], slack[keep]
    # binding edge per destination: the largest ready time (ties: the lowest edge index)
    order = np.lexsort((np.arange(len(ready)), -ready, g.dst))
    dst_sorted = g.dst[order]
    head = np.ones(len(order), bool)
    head[1:] = dst_sorted[1:] != dst_sorted[:-1]
    binding = order[head]
    lag = np.zeros(len(ready), np.int64)
    lag[binding] = slack[binding]
    late = lag < 0
    g.stats["late_nodes"] = int(late.sum())  # started before a hard dependency was met (clock noise)
    g.stats["late_ns"] = int(-lag[late].sum())
    lag[late] = 0
    g.lag_ns = lag
    # sort edges by source for the engine
    o = np.lexsort((g.dst, g.src))
    g.src, g.dst, g.from_end, g.edge_kind, g.lag_ns = g.src[o], g.dst[o], g.from_end[o], g.edge_kind[o], g.lag_ns[o]
