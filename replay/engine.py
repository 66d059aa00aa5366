"""The discrete-event core: one heap of (time, priority, sequence, event), nothing else.

Small on purpose (SimPy's core is the model): no wall clock, no randomness of its own (models draw
from a seeded generator before the run), ties broken by priority then by a counter, so a run is
bit-identical for the same inputs. The models plug in from outside: they decide each node's duration
and each dependency's lag (a collective's transfer is its barrier node's duration); the core only
orders events.

Events are a node's START (priority 1) and END (priority 0, so that at equal times everything that
ends is released before anything new starts). A node starts once every dependency has been released:
at the latest release time plus that dependency's lag. Dependencies are released at their source's
start (`from_end` false) or end.

The loop is plain Python that numba compiles when it is installed (the same source either way); the
compiled core replays millions of nodes per second, the interpreted one a few hundred thousand.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

try:  # compiled when numba is available; the interpreted source is the reference
    from numba import njit as _njit
except ImportError:  # pragma: no cover - numba is a dependency, but keep working without it
    _njit = None

START, END = 1, 0  # priorities: ENDs first at equal times


def _simulate(n, dur, out_ptr, out_dst, out_lag, out_from_end, indeg, source, t0, until):
    """Run the event loop. Returns (start, end) per node; -1 for nodes that never started (or started
    after `until` when until >= 0) and whose end lies past it."""
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    ready = np.full(n, np.iinfo(np.int64).min, np.int64)
    waiting = indeg.copy()
    heap = [(np.int64(t0), np.int64(START), np.int64(0), np.int64(source))]
    seq = 1
    while len(heap) > 0:
        t, prio, _s, node = heapq.heappop(heap)
        if until >= 0 and t > until:
            break
        if prio == START:
            start[node] = t
            point = 0
            heapq.heappush(heap, (t + dur[node], np.int64(END), np.int64(seq), node))
            seq += 1
        else:
            end[node] = t
            point = 1
        for k in range(out_ptr[node], out_ptr[node + 1]):
            if out_from_end[k] != point:
                continue
            d = out_dst[k]
            r = t + out_lag[k]
            if r > ready[d]:
                ready[d] = r
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(heap, (ready[d], np.int64(START), np.int64(seq), d))
                seq += 1
    return start, end


_compiled = None


def _core(compiled: bool):
    global _compiled
    if not compiled or _njit is None:
        return _simulate
    if _compiled is None:
        _compiled = _njit(cache=True, nogil=True)(_simulate)
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
                 compiled: bool = True):
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

    def run(self, dur_ns, lag_ns=None, *, until: int = -1) -> Schedule:
        """Replay with these node durations (and edge lags, default: the constructor's)."""
        dur = np.ascontiguousarray(np.asarray(dur_ns, np.int64))
        if len(dur) != self.n:
            raise ValueError(f"{len(dur)} durations for {self.n} nodes")
        if (dur < 0).any():
            raise ValueError("negative durations")
        lag = self._lag if lag_ns is None else np.ascontiguousarray(np.asarray(lag_ns, np.int64)[self._order])
        if (lag < 0).any():
            raise ValueError("negative lags would let time run backwards")
        start, end = _core(self.compiled)(self.n, dur, self._ptr, self._dst, lag, self._from_end, self._indeg,
                                          np.int64(self.source), np.int64(self.t0), np.int64(until))
        reached = int((start >= 0).sum())
        if until < 0 and reached != self.n:
            raise ValueError(f"{self.n - reached} node(s) never became ready: the graph has a cycle")
        return Schedule(start, end, reached + int((end >= 0).sum()))
