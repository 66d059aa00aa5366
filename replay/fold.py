"""Symmetric-rank folding: ranks whose graphs are identical up to timing noise are replayed once.

Two ranks fold together when their graphs have the same shape (the same sequence of node kinds and
names, and the same collectives) and their measured time differs by at most `tolerance` (relative
difference of the sum of node durations and lags). One representative per class is replayed; the
others take its predicted times. Each collective keeps the arrival of its folded-away participants
as a measured offset after the latest representative (an extra lag on the barrier), so the baseline
stays exact; under a what-if the folded ranks are assumed to keep that offset, which is the stated
approximation (bounded by the tolerance).

Two ways to the same folded graph. `plan` + `fold` cut the graph of every rank down to the
representatives. `plan_from_store` + `fold_built` never build the others: the classes come from one pass
over the store (depgraph.rank_shapes: the same events in the same order on the same tracks, the same
collectives, and the measured working time within tolerance), the representatives' graph is built with
every rank's collective instances (depgraph.run_wide), and the barriers get the same lags. The store's
shape stands for the graph's: two ranks with the same events in the same order get the same nodes unless
their timing cuts a thread differently (a gap in one where the other's ops touch or overlap), which the
tolerance on working time does not rule out; a class can then hold ranks whose graphs differ in a piece.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analyses import depgraph as _graph


@dataclass
class Folding:
    representative: dict  # rank -> the rank replayed for it
    classes: int
    tolerance: float

    @property
    def folded_ranks(self) -> int:
        return sum(1 for r, rep in self.representative.items() if r != rep)


def _signature(g, ids) -> str:
    h = hashlib.sha1()
    h.update(g.kind[ids].tobytes())
    h.update("\x00".join(map(str, g.name[ids])).encode())
    h.update(g.coll[ids].tobytes())
    return h.hexdigest()


def plan(g, tolerance: float = 0.05, keep=()) -> Folding:
    """Classes of ranks with identical graph shape whose measured time is within tolerance. Ranks in
    `keep` (those a scenario changes on their own, e.g. a slowed-down rank) are never folded."""
    node_rank = g.rank
    order = np.argsort(node_rank, kind="stable")
    bounds = np.searchsorted(node_rank[order], g.ranks + [max(g.ranks) + 1])
    in_lag = np.zeros(g.n_nodes, np.int64)
    np.add.at(in_lag, g.dst, g.lag_ns)
    weight = g.dur_ns + in_lag
    shapes: dict = {}
    total = {}
    for k, r in enumerate(g.ranks):
        ids = order[bounds[k]:bounds[k + 1]]
        shapes.setdefault(_signature(g, ids) if r not in keep else f"keep:{r}", []).append(r)
        total[r] = float(weight[ids].sum())
    return _classes(shapes, total, tolerance)


def plan_from_store(shapes, tolerance: float = 0.05, keep=()) -> Folding:
    """plan's classes from the store alone: shapes is depgraph.rank_shapes' (rank, shape, work_ns); ranks of one
    shape whose measured working time is within tolerance fold together (the module docstring says what the
    store's shape stands for)."""
    by_shape: dict = {}
    total = {}
    for r, s, w in zip(shapes["rank"], shapes["shape"], shapes["work_ns"]):
        r = int(r)
        by_shape.setdefault(s if r not in keep else f"keep:{r}", []).append(r)
        total[r] = float(w)
    return _classes(by_shape, total, tolerance)


def _classes(shapes: dict, total: dict, tolerance: float) -> Folding:
    """shapes: {shape: [rank]}; within each shape, the medoid of the remaining ranks by total time represents
    those within tolerance of it, until none remain."""
    rep = {}
    classes = 0
    for members in shapes.values():
        todo = list(members)
        while todo:
            # the medoid of the remaining members (by total time) represents those within tolerance
            vals = np.array([total[r] for r in todo])
            med = todo[int(np.argsort(vals)[len(vals) // 2])]
            near = [r for r in todo if abs(total[r] - total[med]) <= tolerance * max(total[med], 1.0)]
            for r in near:
                rep[r] = med
            todo = [r for r in todo if r not in near]
            classes += 1
    return Folding(rep, classes, tolerance)


def fold(g, folding: Folding):
    """The graph restricted to the representatives, with each barrier waiting for its folded-away
    participants' measured arrival offset."""
    reps = set(folding.representative.values())
    keep = (g.rank < 0) | np.isin(g.rank, list(reps))
    new_id = np.full(g.n_nodes, -1, np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    e_keep = keep[g.src] & keep[g.dst]
    src, dst = new_id[g.src[e_keep]], new_id[g.dst[e_keep]]
    lag = g.lag_ns[e_keep].copy()
    kind = g.edge_kind[e_keep]
    # a barrier's start: the latest arrival over all participants; without the folded ones, the kept
    # arrivals are late by the measured offset of the last folded-away one
    full_start = g.start_ns
    arrive = g.edge_kind == _graph.E["arrive"]
    for b in np.unique(g.dst[arrive]):
        srcs = g.src[arrive & (g.dst == b)]
        kept = srcs[keep[srcs]]
        if len(kept) == len(srcs) or len(kept) == 0:
            continue
        shift = int(full_start[srcs].max() - full_start[kept].max())
        if shift > 0:
            sel = (kind == _graph.E["arrive"]) & (dst == new_id[b])
            lag[sel] += shift
    out = replace(g, kind=g.kind[keep], rank=g.rank[keep], track=g.track[keep], event_id=g.event_id[keep],
                  start_ns=g.start_ns[keep], dur_ns=g.dur_ns[keep], coll=g.coll[keep], name=g.name[keep],
                  src=src, dst=dst, from_end=g.from_end[e_keep], edge_kind=kind, lag_ns=lag,
                  ranks=sorted(reps), notes=list(g.notes), stats=dict(g.stats))
    out.notes.append(_note(folding))
    return out


def fold_built(g, folding: Folding):
    """The graph of the representatives alone, built with every rank's collective instances (depgraph.build with
    run_wide's): as fold gives it, each barrier's kept arrivals late by the measured offset of the last
    folded-away one. Built alone, only the latest kept arrival binds the barrier (its lag is that offset); fold
    gives every kept arrival the offset. g is changed in place and returned."""
    arrive = np.flatnonzero(g.edge_kind == _graph.E["arrive"])
    if len(arrive) and len(g.colls):
        # the barriers some of whose participants were folded away (present_ranks: every rank's)
        ranks = set(g.ranks)
        partial = np.array([not set(map(int, p)) <= ranks for p in g.colls.present_ranks], bool)
        b = g.dst[arrive]
        coll = g.coll[b]
        sel = partial[coll]
        arrive, b = arrive[sel], b[sel]
        if len(arrive):
            latest = pd.Series(g.start_ns[g.src[arrive]]).groupby(b).transform("max").to_numpy(np.int64)
            g.lag_ns[arrive] = np.maximum(g.start_ns[b] - latest, 0)
    g.notes.append(_note(folding))
    return g


def _note(folding: Folding) -> str:
    return (f"folded {folding.folded_ranks} of {len(folding.representative)} ranks into {folding.classes} "
            f"replayed ones (same graph shape, measured time within {100 * folding.tolerance:g}%); "
            "--no-fold replays every rank")
