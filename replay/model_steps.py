"""Applying a scenario to a graph: node durations and edge lags under its models, as an explicit
list of steps run in order.

    compute      the compute model re-times every non-communication node and the CPU gaps on threads
    parallelism  a new data-parallel degree resizes the gradient collectives; tensor / pipeline splits
                 re-schedule each step's forward and backward (a per-rank step change)
    comm         the communication model costs every collective's transfer (its barrier's duration)

Each step takes (graph, scenario, run, state) and updates the state: durations, lags, the
collectives the comm step costs, the calibration the parallelism step made, notes and info.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses import depgraph as _graph

from . import parallelism, pipeline
from .network import CalibratedModel, calibrate
from .optical import OpticalModel
from .specs import Scenario


@dataclass
class ModelState:
    """What one step hands the next."""
    dur_ns: np.ndarray  # per node
    lag_ns: np.ndarray  # per edge
    colls: pd.DataFrame  # the collectives the comm model costs (the graph's, resized by the parallelism step)
    rng: np.random.Generator
    base: CalibratedModel | None = None  # calibrated by the parallelism step; the comm step reuses it
    notes: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # comm: the model; reconfigurations; step_delta: {rank: ns}


def compute_step(g, sc: Scenario, run, st: ModelState) -> None:
    compute = sc.compute_model()
    st.dur_ns = np.asarray(compute.node_durations(g.nodes(), st.rng), np.int64)
    barrier = g.kind == _graph.K["barrier"]
    st.dur_ns[barrier] = g.dur_ns[barrier]
    # the gaps between ops on a thread are CPU time too: they follow the CPU speed of their rank
    thread = g.edge_kind == _graph.E["thread"]
    f = np.full(g.n_edges, 1.0 / compute.cpu_scale)
    for r, k in compute.rank_slowdown.items():
        f[g.rank[g.dst] == int(r)] *= k
    sel = thread & (f != 1.0)
    st.lag_ns[sel] = np.rint(st.lag_ns[sel] * f[sel]).astype(np.int64)


def parallelism_step(g, sc: Scenario, run, st: ModelState) -> None:
    par = sc.parallelism
    if not len(g.colls) or not par.changes_layout:
        return
    lay = parallelism.layout(run) if run is not None else {}
    base = sc.calibrate(g.colls) if sc.network.calibrate != "none" else None
    st.base = base if base is not None else calibrate(g.colls)
    # a degree the run already has (or no layout to compare with: pipeline.step_delta says what is missing)
    new = {"tp": par.tp, "pp": par.pp, "micro_batches": par.micro_batches}
    if any(v is not None and (not lay or v != lay.get(k, 1)) for k, v in new.items()):
        st.info["step_delta"], more = pipeline.step_delta(run, g, par, lay, st.base, sc.network.gpus_per_node)
        st.notes += more
    if par.dp is not None:
        st.colls, more = parallelism.apply_dp(g, par.dp, lay, st.base)
        st.notes += more


def comm_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not len(g.colls):
        return
    comm = sc.comm_model(st.base if st.base is not None and sc.needs_calibration else st.colls)
    transfer = np.asarray(comm.transfer_ns(st.colls, st.rng), np.int64)
    if "dp_wait_shift_ns" in st.colls:  # the slowest of more (fewer) ranks arrives later (earlier)
        transfer = np.maximum(transfer + st.colls.dp_wait_shift_ns.to_numpy(np.int64), 0)
    barrier_ids = np.flatnonzero(g.kind == _graph.K["barrier"])
    st.dur_ns[barrier_ids[np.argsort(g.coll[barrier_ids])]] = transfer
    st.notes += [n for n in comm.notes if n not in st.notes]
    st.info["comm"] = comm
    if isinstance(comm, OpticalModel):
        st.info["reconfigurations"] = int(comm.reconfigurations)


MODEL_STEPS = (compute_step, parallelism_step, comm_step)


def apply_models(g, scenario: Scenario | None, run=None):
    """Node durations and edge lags under the scenario's models (measured when scenario is None).
    Returns (dur_ns per node, lag_ns per edge, notes, info) where info holds the models used."""
    if scenario is None:
        return g.dur_ns.copy(), g.lag_ns.copy(), [], {}
    st = ModelState(dur_ns=g.dur_ns.copy(), lag_ns=g.lag_ns.copy(), colls=g.colls,
                    rng=np.random.default_rng(scenario.seed))
    for step in MODEL_STEPS:
        step(g, scenario, run, st)
    return np.maximum(st.dur_ns, 0), st.lag_ns, st.notes, st.info
