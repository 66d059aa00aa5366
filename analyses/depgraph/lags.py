"""Binding dependencies: each node's binding dependency (the one satisfied last on the measured times)
gets the measured ready-to-start lag, inferred dependencies the measurements contradict are dropped, and
the critical predecessors the critical path walks back along are the same binding dependencies."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .collectives import P2P_OPS
from .model import EDGE_KINDS, E, Graph

# inferred dependencies: the measured times may contradict them (then they are dropped), hard ones never
_SOFT = np.array([k in ("event_wait", "sync", "enqueue", "host_wait") for k in EDGE_KINDS])


def bind_lags(g: Graph) -> None:
    """Give each node's binding dependency (the one satisfied last, on measured times) the measured
    ready-to-start lag; drop inferred dependencies the measurements contradict."""
    if g.n_edges == 0:
        return
    ready = ready_ns(g)
    slack = g.start_ns[g.dst] - ready
    contradicted = (slack < 0) & _SOFT[g.edge_kind]
    if contradicted.any():
        dropped = np.bincount(g.edge_kind[contradicted], minlength=len(EDGE_KINDS))
        g.notes.append("dropped inferred dependencies the measured times contradict: " + ", ".join(
            f"{EDGE_KINDS[k]} {n}" for k, n in enumerate(dropped) if n))
        keep = ~contradicted
        g.src, g.dst, g.from_end, g.edge_kind = g.src[keep], g.dst[keep], g.from_end[keep], g.edge_kind[keep]
        ready, slack = ready[keep], slack[keep]
    # binding edge per destination: the largest ready time (ties: the lowest edge index)
    binding = _first_per_dst(np.lexsort((np.arange(len(ready)), -ready, g.dst)), g.dst)
    binding = _woken_by_collectives(g, ready, binding)
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


def _woken_by_collectives(g: Graph, ready: np.ndarray, binding: np.ndarray) -> np.ndarray:
    """A caller that woke from a wait on a collective (host_wait) while its rank's side of the collective was still
    under way when the thread's last piece ended waited on the collective, not on its thread: the shared transfer
    can end before the wait begins when the caller's own side finished later (a token bucket that ran dry on one
    host's link). Its host_wait edge binds then, so that a faster link shortens the wait. The rank's side is done
    when its participant is released (the release edges' targets). Not for a send or a recv: a gloo send's own
    completion is when its caller got round to it (the message had arrived long before), not a side of the
    transfer still under way."""
    woke = np.flatnonzero(g.edge_kind == E["host_wait"])
    if not len(woke) or not len(g.colls):
        return binding
    p2p = g.colls.coll_id[g.colls.op.isin(P2P_OPS)].to_numpy(np.int64)
    woke = woke[~np.isin(g.coll[g.src[woke]], p2p)]
    rel = np.flatnonzero((g.edge_kind == E["release"]) & g.from_end)
    done = pd.Series(g.start_ns[g.dst[rel]]).groupby([g.src[rel], g.rank[g.dst[rel]]]).max()
    done_at = done.reindex(pd.MultiIndex.from_arrays([g.src[woke], g.rank[g.dst[woke]]])).to_numpy(
        np.float64, na_value=-1.0)
    bind_of = np.full(g.n_nodes, -1, np.int64)
    bind_of[g.dst[binding]] = binding
    cur = bind_of[g.dst[woke]]
    take = (cur >= 0) & (cur != woke) & (g.edge_kind[np.maximum(cur, 0)] != E["host_wait"])
    take &= done_at > ready[np.maximum(cur, 0)]
    # the first such edge of each caller's piece
    d, first = np.unique(g.dst[woke[take]], return_index=True)
    bind_of[d] = woke[take][first]
    return bind_of[bind_of >= 0]


def ready_ns(g: Graph) -> np.ndarray:
    """Per edge: when it is satisfied on the measured times (the source's end, or its start)."""
    start = g.start_ns[g.src]
    return np.where(g.from_end, start + g.dur_ns[g.src], start)


def critical_edges(g: Graph) -> np.ndarray:
    """Per node: the edge of its critical predecessor (-1: none), its binding dependency on the measured
    times. A tie goes to a launch or a sync (an op whose stream was already free when its launch began
    waited on the launch), then to the later source node."""
    out = np.full(g.n_nodes, -1, np.int64)
    if g.n_edges == 0:
        return out
    prefer = np.isin(g.edge_kind, (E["launch"], E["sync"]))
    order = np.lexsort((-g.src, ~prefer, -ready_ns(g), g.dst))
    binding = _first_per_dst(order, g.dst)
    out[g.dst[binding]] = binding
    return out


def _first_per_dst(order: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The first edge of each destination in `order` (edges sorted by destination first)."""
    dst_sorted = dst[order]
    head = np.ones(len(order), bool)
    head[1:] = dst_sorted[1:] != dst_sorted[:-1]
    return order[head]
