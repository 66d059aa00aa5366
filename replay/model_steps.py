"""Applying a scenario to a graph: node durations and edge lags under its models, as an explicit
list of steps run in order.

    topology     a [topology] recounts each collective's hosts (which link class it crosses)
    compute      the compute model re-times every non-communication node and the CPU gaps on threads
    hardware     a [hardware] GPU re-times the GPU ops by their roofline position (replay/hardware.py)
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

from . import links, parallelism, pipeline, pools, topology
from .checks import ScenarioError
from .network import CalibratedModel, calibrate
from .optical import OpticalModel
from .sharing import Flows
from .specs import Scenario


@dataclass
class ModelState:
    """What one step hands the next."""
    dur_ns: np.ndarray  # per node
    lag_ns: np.ndarray  # per edge
    colls: pd.DataFrame  # the collectives the comm model costs (the graph's, resized by the parallelism step)
    rng: np.random.Generator
    base: CalibratedModel | None = None  # calibrated by the parallelism step; the comm step reuses it
    nccl_tests: pd.DataFrame | None = None  # the store's nccl-tests rows, read once when the scenario calibrates on them
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


def hardware_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not sc.hardware.given:
        return
    from . import hardware

    got = hardware.retime(g, run, sc.hardware, st.dur_ns, sc.where)
    touched = got.factor != 1.0
    st.dur_ns[touched] = np.rint(st.dur_ns[touched] * got.factor[touched]).astype(np.int64)
    st.notes += got.notes
    if got.info:
        st.info["hardware"] = got.info


def topology_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not sc.topology.given or not len(g.colls):
        return
    st.colls, more = topology.apply(st.colls, sc.topology, g.ranks, sc.where)
    st.notes += more


def parallelism_step(g, sc: Scenario, run, st: ModelState) -> None:
    par = sc.parallelism
    if not len(g.colls) or not par.changes_layout:
        return
    lay = parallelism.layout(run) if run is not None else {}
    base = sc.calibrate(st.colls, st.nccl_tests) if sc.network.calibrate != "none" else None
    st.base = base if base is not None else calibrate(st.colls)
    # a degree the run already has (or no layout to compare with: pipeline.step_delta says what is missing)
    new = {"tp": par.tp, "pp": par.pp, "micro_batches": par.micro_batches}
    if any(v is not None and (not lay or v != lay.get(k, 1)) for k, v in new.items()):
        st.info["step_delta"], more = pipeline.step_delta(run, g, par, lay, st.base, sc.network.gpus_per_node)
        st.notes += more
    if par.dp is not None:
        st.colls, more = parallelism.apply_dp(st.colls, par.dp, lay, st.base)
        st.notes += more


def comm_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not len(g.colls):
        return
    if sc.network.model == "links":
        return links_step(g, sc, run, st)
    comm = sc.comm_model(st.base if st.base is not None and sc.needs_calibration else st.colls,
                         nccl_tests=st.nccl_tests)
    transfer = np.asarray(comm.transfer_ns(st.colls, st.rng), np.int64)
    if "dp_wait_shift_ns" in st.colls:  # the slowest of more (fewer) ranks arrives later (earlier)
        transfer = np.maximum(transfer + st.colls.dp_wait_shift_ns.to_numpy(np.int64), 0)
    barrier_ids = np.flatnonzero(g.kind == _graph.K["barrier"])
    st.dur_ns[barrier_ids[np.argsort(g.coll[barrier_ids])]] = transfer
    st.notes += [n for n in comm.notes if n not in st.notes]
    st.info["comm"] = comm
    if sc.network.changes_network or sc.parallelism.dp is not None:
        _overlap_note(g, sc, st)
    if isinstance(comm, OpticalModel):
        st.info["reconfigurations"] = int(comm.reconfigurations)
        hosts = st.colls["n_hosts"].to_numpy(dtype="float64", na_value=np.nan)
        if not comm.reconfigurations and not (hosts > 1).any():
            st.notes.append(f"{sc.where}: [optical] changes nothing: every collective runs inside one host as the "
                            "run's hosts say (run.json, else the traces' host names); if the ranks ran on "
                            "several hosts, say which with [topology] ranks_per_host or hosts")


def _overlap_note(g, sc: Scenario, st: ModelState) -> None:
    """The alpha-beta model costs each collective alone; where the run's transfers shared a link, say so and
    name the model that shares it."""
    lf = links.build(g.colls, _host_index(g, sc))
    if len(lf) < 2:
        return
    start = g.colls.barrier_start_ns.to_numpy(np.int64)[lf.coll_row]
    end = start + g.colls.measured_transfer_ns.to_numpy(np.int64)[lf.coll_row]
    n = int(links.overlapped(lf, start, end).sum())
    if n:
        st.notes.append(f"{sc.where}: {n} of {len(lf)} collectives shared a link with another in the run (e.g. DDP "
                        "buckets on gloo's worker threads); the alpha-beta model costs each as if it had the link "
                        "to itself and over-counts the link: [network] model = 'links' shares it "
                        "(docs/whatif_models.md section 6)")


def links_step(g, sc: Scenario, run, st: ModelState) -> None:
    """[network] model = 'links': every collective a flow over the hosts' links (replay/links.py), capacity and
    latency per link class fitted on the measured run's own transfers, then changed as the scenario says."""
    host_of = _host_index(g, sc)
    net = sc.network
    if net.calibrate == "nccl_tests":  # one collective at a time: the alpha-beta fit is each link alone
        fitted = links.from_alpha_beta(sc.calibrate(g.colls, st.nccl_tests))
    else:
        measured = links.build(g.colls, host_of)
        starts = g.colls.barrier_start_ns.to_numpy(np.int64)[measured.coll_row]
        fitted = links.fit(measured, starts, g.colls.measured_transfer_ns.to_numpy(np.int64)[measured.coll_row])
    over = net.packet_links
    prm = fitted.params.scaled(
        bandwidth=net.bandwidth_scale, latency=net.latency_scale,
        capacity={c: o.bandwidth_gbps for c, o in over.items() if o.bandwidth_gbps is not None},
        latency_ns={c: o.latency_us * 1e3 for c, o in over.items() if o.latency_us is not None},
        host_scale=_host_scales(net.hosts, host_of, sc.where))
    lf = links.build(st.colls, _extend(host_of, st.colls))
    barrier = np.flatnonzero(g.kind == _graph.K["barrier"])
    node_of = barrier[np.argsort(g.coll[barrier])]  # barrier node of each collective row
    flows = lf.flows(node_of[lf.coll_row], prm)
    if "dp_wait_shift_ns" in st.colls:  # the slowest of more (fewer) ranks arrives later (earlier)
        shift = st.colls.dp_wait_shift_ns.to_numpy(np.int64)[lf.coll_row]
        flows = Flows(flows.node, flows.bytes, np.maximum(flows.latency_ns + shift, 0), flows.route_ptr,
                      flows.route_links, flows.capacity)
    _scale_release_lags(g, st, lf, flows, fitted.params, prm, node_of)
    rest = np.setdiff1d(np.arange(len(st.colls)), lf.coll_row)
    st.dur_ns[node_of[rest]] = st.colls.measured_transfer_ns.to_numpy(np.int64)[rest]
    st.info["flows"] = flows
    st.info["links"] = fitted
    pooled = pools.gloo_pools(g, st.lag_ns)
    if pooled is not None:
        st.info["edge_src"], st.info["edge_from_end"], st.lag_ns, st.info["pools"], n_jobs = pooled
        st.notes.append(f"gloo worker threads as a pool: {n_jobs} collective(s) run on whichever of their rank's "
                        "runloop threads is free, in the order they were enqueued")
    for c, rms in fitted.rel_rms.items():
        how = ("from nccl-tests" if net.calibrate == "nccl_tests"
               else f"over {fitted.flows[c]} transfer(s) replayed as flows")
        nominal = _nominal_rates(run) if c == links.INTER else ""
        st.notes.append(f"links model: {c} fitted {fitted.params.capacity[c] * 8e3:.4g} Mbit/s "
                        f"({fitted.params.capacity[c]:.4g} GB/s), latency {fitted.params.latency_ns[c] / 1e3:.4g} us per "
                        f"step, {how} (busy periods' residual {100 * rms:.1f}% rms){nominal}")
    st.notes += [n for n in lf.notes if n not in st.notes]


def _scale_release_lags(g, st: ModelState, lf, flows, fit_prm, prm, node_of) -> None:
    """A participant released after the shared transfer ended (its incoming direction still carried data)
    waits for the link too: its release and host-wait lags follow the flow's bottleneck capacity."""
    old = lf.flows(flows.node, fit_prm).capacity
    new = flows.capacity
    k = np.ones(len(node_of))
    for i in range(len(lf)):
        route = lf.route_links[lf.route_ptr[i]:lf.route_ptr[i + 1]]
        k[lf.coll_row[i]] = old[route].min() / new[route].min()
    bar = np.full(g.n_nodes, -1, np.int64)
    bar[node_of] = np.arange(len(node_of))
    sel = np.isin(g.edge_kind, [_graph.E["release"], _graph.E["host_wait"]]) & (bar[g.src] >= 0)
    f = k[bar[g.src[sel]]]
    st.lag_ns[sel] = np.rint(st.lag_ns[sel] * f).astype(np.int64)


def _nominal_rates(run) -> str:
    """The NIC rates the run was shaped to, where run.json's testbed block says (the tc rates), for the notes."""
    try:
        rates = {int(x["host"]): float(x["rate_mbit"]) for x in run.run_manifest()["testbed"]["links"]}
    except (AttributeError, KeyError, TypeError, ValueError):
        return ""
    if not rates:
        return ""
    if len(set(rates.values())) == 1:
        return f"; nominal {next(iter(rates.values())):.4g} Mbit/s (the testbed's tc rate, run.json)"
    each = ", ".join(f"host {h} {r:.4g}" for h, r in sorted(rates.items()))
    return (f"; nominal {each} Mbit/s (the testbed's tc rates, run.json): a ring is paced by its slowest NIC, "
            f"{min(rates.values()):.4g}, and one that crosses every host's NIC cannot tell them apart")


def _nccl_tests(run, sc: Scenario):
    """The store's nccl-tests rows when the scenario calibrates from them (else None: not read)."""
    if sc.network.calibrate != "nccl_tests" or run is None:
        return None
    return run.sql("SELECT * FROM nccl_tests")


def _host_index(g, sc: Scenario) -> dict[int, int]:
    """rank -> host index: the scenario's [topology], else the graph's hosts."""
    ranks = [int(r) for r in g.hosts["rank"]]
    if sc.topology.given:
        return topology.host_of(sc.topology, set(ranks) | {int(r) for grp in g.colls["ranks"] for r in grp}, sc.where)
    names: dict = {}  # ranks whose host nothing names share one unknown host, as the alpha-beta model takes them
    return {r: names.setdefault(h if isinstance(h, str) and h else None, len(names))
            for r, h in zip(ranks, g.hosts["hostname"])}


def _extend(host_of: dict[int, int], colls) -> dict[int, int]:
    """Ranks a data-parallel change added, placed as the run's ranks are: as many per host, on new hosts."""
    out = dict(host_of)
    added = sorted({int(r) for grp in colls["ranks"] for r in grp} - set(out))
    if added:
        per_host = max(1, round(len(host_of) / max(1, len(set(host_of.values())))))
        first = max(out.values(), default=-1) + 1
        base = min(added)
        for r in added:
            out[r] = first + (r - base) // per_host
    return out


def _host_scales(hosts, host_of: dict[int, int], where: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for i, h in enumerate(hosts, 1):
        for r in h.ranks:
            if r not in host_of:
                raise ScenarioError(f"{where}: [[network.hosts]] #{i} ranks: rank {r} is not a rank of the run")
            out[host_of[r]] = h.bandwidth_scale
    return out


MODEL_STEPS = (topology_step, compute_step, hardware_step, parallelism_step, comm_step)


def apply_models(g, scenario: Scenario | None, run=None):
    """Node durations and edge lags under the scenario's models (measured when scenario is None).
    Returns (dur_ns per node, lag_ns per edge, notes, info) where info holds the models used."""
    if scenario is None:
        return g.dur_ns.copy(), g.lag_ns.copy(), [], {}
    st = ModelState(dur_ns=g.dur_ns.copy(), lag_ns=g.lag_ns.copy(), colls=g.colls,
                    rng=np.random.default_rng(scenario.seed), nccl_tests=_nccl_tests(run, scenario))
    for step in MODEL_STEPS:
        step(g, scenario, run, st)
    return np.maximum(st.dur_ns, 0), st.lag_ns, st.notes, st.info
