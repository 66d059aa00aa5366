"""The discrete-event core: one heap of (time, priority, sequence, event), nothing else.

Small on purpose (SimPy's core is the model): no wall clock, no randomness of its own (models draw
from a seeded generator before the run), ties broken by priority then by a counter, so a run is
bit-identical for the same inputs. The models plug in from outside: they decide each node's duration
and each dependency's lag (a collective's transfer is its barrier node's duration); the core only
orders events.

Events are a node's start (priority 1: READY, or SERVED for pool work that got a server) and END (priority 0,
so that at equal times everything that ends is released before anything new starts); each heap entry says
its kind and its item (a node, or for a flow CHECK the rates version) apart. A node starts once every dependency has been released:
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

The loop takes its inputs as named tuples of arrays (`Deps`, sharing.FlowArrays, pools.PoolArrays) and
leaves the flows' and the pools' bookkeeping to the helpers of replay/sharing.py and replay/pools.py. It is
plain Python that numba compiles when it is installed (the same source either way, helpers included); the
compiled core replays millions of nodes per second, the interpreted one a few hundred thousand. The machine
code is cached on disk (see _jit), so only a fresh install's first replay compiles; numba checks only this
file's time stamp for the loop's cache, and a digest of sharing.py's and pools.py's sources beside it
(_drop_stale) makes the loop compile again where only a helper changed.
"""
from __future__ import annotations

import hashlib
import heapq
import os
import tempfile
import types
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

try:  # compiled when numba is available; the interpreted source is the reference
    from numba import njit as _njit
except ImportError:  # pragma: no cover - numba is a dependency, but keep working without it
    _njit = None

from . import pools as _pools
from . import sharing as _sharing
from .sharing import N_ACTIVE, VERSION, Flows

# priorities: ENDs (and flow CHECKs) first at equal times; ACTIVATE ranks with START
PRIO_END, PRIO_START = 0, 1
# event kinds; the heap holds (time, priority, sequence, kind, item)
READY = 0  # item: a node whose dependencies are released: it starts (a pool node takes a server, or queues)
SERVED = 1  # item: a pool node that got a server given back: it starts
END = 2  # item: a node
ACTIVATE = 3  # item: a flow's node, whose latency has passed: the flow starts moving
CHECK = 4  # item: the rates version under which flows were predicted to end now (stale when the rates changed)


class Deps(NamedTuple):
    """The dependency graph as the loop takes it: out-edges in CSR by source (node u's are ptr[u]:ptr[u + 1]),
    each edge's destination, lag and whether it is released at its source's end (1) or start (0); each node's
    number of dependencies; the origin node and when it starts."""

    ptr: np.ndarray
    dst: np.ndarray
    lag_ns: np.ndarray
    from_end: np.ndarray
    indeg: np.ndarray
    source: np.int64
    t0_ns: np.int64


def _jit(f, inlines=()):
    """f compiled by numba (plain f without numba), its machine code cached on disk for the next process: in
    NUMBA_CACHE_DIR when set, else beside the package, else (a read-only install) in numba's user-wide cache
    (~/.cache/numba), else in a folder of this user's own in the temp dir, else not cached. numba's own chain
    stops before the temp dir and refuses to compile (a traceback on `tracekit replay`). inlines: the source files
    of the helpers f inlines, whose changes numba's cache does not see (_drop_stale)."""
    if _njit is None:
        return f
    cached = _cached(f)
    if cached is None and _private_cache_dir() is not None:
        cached = _cached(f)
    if cached is None:
        return _njit(nogil=True)(f)
    if inlines:
        _drop_stale(cached, inlines)
    return cached


def _drop_stale(dispatcher, helpers) -> None:
    """numba keys a cached function on its own file's time stamp alone, while the loop inlines the helpers of
    sharing.py and pools.py: beside the cache, a digest of the helpers' sources says which ones it was compiled
    with, and where they changed the cache's index is emptied before the first call, so that the loop compiles
    again (a checkout where only a helper was edited would otherwise run the old machine code)."""
    try:
        cache = dispatcher._cache
        sidecar = os.path.join(cache._cache_path, f"{dispatcher.py_func.__name__}.helpers.sha256")
    except AttributeError:  # a numba whose cache has another shape: its own stamp check only
        return
    digest = hashlib.sha256()
    for path in helpers:
        with open(path, "rb") as fh:
            digest.update(fh.read())
    try:
        with open(sidecar) as fh:
            if fh.read() == digest.hexdigest():
                return
    except OSError:
        pass
    cache.flush()
    try:
        with open(sidecar, "w") as fh:
            fh.write(digest.hexdigest())
    except OSError:
        pass


def _cached(f):
    """njit(cache=True) of f, or None where numba finds no place it can write its cache to."""
    try:
        return _njit(cache=True, nogil=True)(f)
    except RuntimeError as e:  # numba: "cannot cache function ...: no locator available for file ..."
        if "no locator available" not in str(e):
            raise
        return None


def _private_cache_dir() -> str | None:
    """NUMBA_CACHE_DIR made a folder only this user can write, in the temp dir (None: there is none, or the user
    set NUMBA_CACHE_DIR, which numba tried first)."""
    import numba

    if numba.config.CACHE_DIR:
        return None
    uid = getattr(os, "getuid", None)
    if uid is None:
        return None
    path = os.path.join(tempfile.gettempdir(), f"tracekit-numba-{uid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid != uid() or st.st_mode & 0o022 or not os.access(path, os.W_OK):
        return None  # another user's, or writable by others: their cache files would run here
    numba.config.CACHE_DIR = path
    return path


def _inlined(f):
    """f as numba inlines it into the compiled loop (its code is the loop's: compiled and cached with it, not apart,
    which would cost a fresh install's first replay a compilation each); plain f without numba."""
    return _njit(inline="always", nogil=True)(f) if _njit is not None else f


# the helpers the loop calls: compiled with it; the interpreted loop (_interpreted) calls the plain ones
_max_min = _jit(_sharing.max_min_rates)  # called on its own too (replay/linkfit.py)
_flow_state, _advance, _activate, _end_due, _predict_ends = (
    _inlined(f) for f in (_sharing.flow_state, _sharing.advance, _sharing.activate, _sharing.end_due,
                          _sharing.predict_ends))
_pool_queues, _take, _give = (_inlined(f) for f in (_pools.pool_queues, _pools.take, _pools.give))


def _simulate(deps: Deps, dur, until, fl: _sharing.FlowArrays, pl: _pools.PoolArrays):
    """Run the event loop. Returns (start, end) per node; -1 for nodes that never started (or started after
    `until` when until >= 0) and whose end lies past it."""
    n = len(dur)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    ready = np.full(n, np.iinfo(np.int64).min, np.int64)
    waiting = deps.indeg.copy()
    heap = [(deps.t0_ns, np.int64(PRIO_START), np.int64(0), np.int64(READY), deps.source)]
    seq = 1
    fs = _flow_state(fl, deps.t0_ns)
    pq = _pool_queues(pl)
    while len(heap) > 0:
        t, prio, _s, kind, item = heapq.heappop(heap)
        if until >= 0 and t > until:
            break
        if kind == ACTIVATE or kind == CHECK:
            if kind == CHECK and item != fs.clock[VERSION]:
                continue  # the rates changed since this end was predicted
            _advance(fs, t)
            if kind == CHECK:  # the flows predicted to end now end; their nodes end with them
                for i in range(_end_due(fs, fl, t)):
                    heapq.heappush(heap, (t, np.int64(PRIO_END), np.int64(seq), np.int64(END), fs.ended[i]))
                    seq += 1
            else:
                _activate(fs, fl, fl.flow_of[item], t)
            _max_min(fs.active, fs.clock[N_ACTIVE], fl.route_ptr, fl.route_links, fl.capacity, fs.rate, fs.rem_cap,
                     fs.n_on, fs.frozen, fs.touched)
            soonest = _predict_ends(fs, t)
            if fs.clock[N_ACTIVE] > 0:
                heapq.heappush(heap, (soonest, np.int64(PRIO_END), np.int64(seq), np.int64(CHECK), fs.clock[VERSION]))
                seq += 1
            continue
        node = item
        if kind == READY and pl.acquire[node] >= 0 and not _take(pq, pl.acquire[node], node):
            continue  # queued until a server is given back
        if kind == END:
            end[node] = t
            point = 1
            p = pl.release[node]
            if p >= 0:  # the server goes to the oldest waiting work of the pool, or becomes free
                nxt = _give(pq, p)
                if nxt >= 0:
                    heapq.heappush(heap, (t, np.int64(PRIO_START), np.int64(seq), np.int64(SERVED), nxt))
                    seq += 1
        else:
            start[node] = t
            point = 0
            f = fl.flow_of[node]
            if f >= 0:  # moves once its latency has passed; its end comes from the sharing
                heapq.heappush(heap, (t + fl.latency_ns[f], np.int64(PRIO_START), np.int64(seq), np.int64(ACTIVATE),
                                      node))
            else:
                heapq.heappush(heap, (t + dur[node], np.int64(PRIO_END), np.int64(seq), np.int64(END), node))
            seq += 1
        for k in range(deps.ptr[node], deps.ptr[node + 1]):
            if deps.from_end[k] != point:
                continue
            d = deps.dst[k]
            r = t + deps.lag_ns[k]
            if r > ready[d]:
                ready[d] = r
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(heap, (ready[d], np.int64(PRIO_START), np.int64(seq), np.int64(READY), d))
                seq += 1
    return start, end


# the same loop over the plain helpers: the reference the compiled one must equal bit for bit
_interpreted = types.FunctionType(_simulate.__code__, {
    **globals(), "_max_min": _sharing.max_min_rates, "_flow_state": _sharing.flow_state, "_advance": _sharing.advance,
    "_activate": _sharing.activate, "_end_due": _sharing.end_due, "_predict_ends": _sharing.predict_ends,
    "_pool_queues": _pools.pool_queues, "_take": _pools.take, "_give": _pools.give}, "_interpreted")
_compiled = None


# a plain replay (no flows, no pools) of fewer nodes than this runs interpreted while the compiled loop is not loaded
# in this process: ~0.2 s at the interpreted loop's few hundred thousand nodes a second, where compiling the loop
# takes a fresh install 3-4 s and loading it from the cache 0.4 s (a newcomer's first `tracekit replay` of a
# sample: 3,606 nodes in 15 ms). Both loops give the same schedule to the ns.
INTERPRETED_MAX_NODES = 50_000


def _core(compiled: bool | None, n_nodes: int = 0, plain: bool = False):
    """The loop to run: compiled (True), interpreted (False), or (None) compiled unless a plain replay of a small
    graph (INTERPRETED_MAX_NODES) would pay more to load or compile it than to run interpreted."""
    global _compiled
    if compiled is None:
        compiled = _compiled is not None or not plain or n_nodes >= INTERPRETED_MAX_NODES
    if not compiled or _njit is None:
        return _interpreted
    if _compiled is None:
        _compiled = _jit(_simulate, inlines=(_sharing.__file__, _pools.__file__))
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
                 compiled: bool | None = None):
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
        fl = (Flows.none() if flows is None else flows).arrays(self.n)
        deps = Deps(self._ptr, self._dst, lag, self._from_end, self._indeg, np.int64(self.source), np.int64(self.t0))
        plain = (flows is None or not len(flows)) and pools is None
        start, end = _core(self.compiled, self.n, plain)(deps, dur, np.int64(until), fl,
                                                        _pools.engine_pools(self.n, pools))
        reached = int((start >= 0).sum())
        if until < 0 and reached != self.n:
            raise ValueError(f"{self.n - reached} node(s) never became ready: the graph has a cycle")
        return Schedule(start, end, reached + int((end >= 0).sum()))

