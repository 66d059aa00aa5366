"""Applying a scenario to a graph: node durations and edge lags under its models, as an explicit
list of steps run in order.

    topology     a [topology] recounts each collective's hosts (which link class it crosses)
    compute      the compute model re-times every non-communication node and the CPU gaps on threads
    hardware     a [hardware] GPU re-times the GPU ops by their roofline position (replay/hardware.py)
    parallelism  a new data-parallel degree resizes the gradient collectives; tensor / pipeline splits
                 re-schedule each step's forward and backward (a per-rank step change)
    comm         the communication model costs every collective's transfer (its barrier's duration)

Each step takes (graph, scenario, run, state) and updates the state: durations, lags, the
collectives the comm step costs, the calibration the parallelism step made, notes, and what the models chose
(ModelInfo: what the engine needs beyond durations and lags, and what the result reports).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analyses import depgraph as _graph
from tracekit.shaping import bucket_of

from . import costs, linkfit, links, parallelism, pools, topology
from .calibration import calibrate
from .checks import ScenarioError
from .network import CalibratedModel, CommModel
from .optical import OpticalModel
from .sharing import Flows
from .specs import Scenario

if TYPE_CHECKING:  # hardware is imported when a scenario has a [hardware] section
    from .hardware import RetimedOps


@dataclass
class ModelInfo:
    """What the models chose: for the engine (re-routed edges, flows, pools) and for the result."""
    comm: CommModel | None = None  # the model that costed the collectives alone (comm step; alpha-beta, optical, ...)
    links: linkfit.Fit | None = None  # the links model's fit on the run's transfers
    links_fit: tuple | None = None  # fit_links: the run's flows, the fit, the nominal rate (fitted once)
    flows: Flows | None = None  # the links model's transfers, timed by sharing in the engine
    pools: tuple | None = None  # gloo's worker threads: (acquire, release, servers), as Engine.run takes them
    edge_src: np.ndarray | None = None  # per edge, its source once the pools re-routed it (None: the graph's)
    edge_from_end: np.ndarray | None = None  # per edge, released at its source's end (None: the graph's)
    reconfigurations: int | None = None  # optical circuit reconfigurations (None: no [optical])
    step_scale: float | None = None  # what a re-layout multiplies every replayed step by (replay/relayout.py)
    relayout: object | None = None  # relayout.Plan: the re-layout the parallelism step decided
    hardware: RetimedOps | None = None  # the GPU ops [hardware] re-timed
    memory: object | None = None  # memory.OpFacts: what [batch] and [memory] read of the run's ops


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
    info: ModelInfo = field(default_factory=ModelInfo)


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


def memory_step(g, sc: Scenario, run, st: ModelState) -> None:
    """[batch] scale and [memory]: the ops that follow the step's tokens, checkpoint recompute and the
    optimizer's state over the host link (replay/memory.py)."""
    if sc.batch.scale == 1.0 and not sc.memory.changes_memory:
        return
    from . import memory

    if run is None:
        raise ScenarioError(f"{sc.where}: [batch] and [memory] read the run's ops and allocations: replay a stored "
                            "run")
    facts = memory.op_facts(run, g)
    got = memory.retime(g, run, sc, facts, st.dur_ns)
    touched = got.factor != 1.0
    st.dur_ns[touched] = np.rint(st.dur_ns[touched] * got.factor[touched]).astype(np.int64)
    if sc.memory.offload_optimizer:
        added, _, more = memory.offload(run, g, facts, sc)
        st.dur_ns += added
        got.notes += more
    if (got.colls_bytes_scale != 1.0).any():
        b = st.colls["bytes"].to_numpy(dtype="float64", na_value=np.nan)
        st.colls = st.colls.assign(bytes=pd.array(np.rint(b * got.colls_bytes_scale), dtype="Int64"))
    st.notes += got.notes
    st.info.memory = facts


def hardware_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not sc.hardware.given:
        return
    from . import hardware

    got = hardware.retime(g, run, sc.hardware, st.dur_ns, sc.where)
    touched = got.factor != 1.0
    st.dur_ns[touched] = np.rint(st.dur_ns[touched] * got.factor[touched]).astype(np.int64)
    st.notes += got.notes
    st.info.hardware = got.ops


def topology_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not sc.topology.given or not len(g.colls):
        return
    st.colls, more = topology.apply(st.colls, sc.topology, g.ranks, sc.where)
    st.notes += more


def parallelism_step(g, sc: Scenario, run, st: ModelState) -> None:
    par = sc.parallelism
    if not par.changes_layout:
        return
    if par.relayout:  # the whole layout re-timed from the traces, the global batch kept (replay/relayout.py)
        from . import memory, relayout

        if run is None:
            raise ScenarioError(f"{sc.where}: [parallelism] re-lays the run out from its ops and shapes: replay a "
                                "stored run")
        facts = st.info.memory if st.info.memory is not None else memory.op_facts(run, g)
        st.info.memory = facts
        _, fitted, nominal = fit_links(g, sc, run, st)
        st.info.step_scale, more, st.info.relayout = relayout.step_scale(
            run, g, facts, par, scenario_link_params(g, sc, fitted), nominal, sc.network.gpus_per_node,
            sc.batch.scale, sc.where)
        st.notes += more
        return
    if not len(g.colls):
        return
    lay = parallelism.layout(run) if run is not None else {}
    base = sc.calibrate(st.colls, st.nccl_tests) if sc.network.calibrate != "none" else None
    st.base = base if base is not None else calibrate(st.colls)
    if par.dp is not None:
        st.colls, more = parallelism.apply_dp(st.colls, par.dp, lay, st.base)
        st.notes += more


def comm_step(g, sc: Scenario, run, st: ModelState) -> None:
    if not len(g.colls):
        return
    if sc.network.model == "links":
        why = _alpha_beta_only(sc)
        if why is None:
            return links_step(g, sc, run, st)
        st.notes.append(f"{sc.where}: {why}, which the links model does not model: this scenario's collectives are "
                        "costed by the alpha-beta model (each alone, no sharing)")
    comm = sc.comm_model(st.base if st.base is not None and sc.needs_calibration else st.colls,
                         nccl_tests=st.nccl_tests)
    transfer = np.asarray(comm.transfer_ns(st.colls, st.rng), np.int64)
    if "dp_wait_shift_ns" in st.colls:  # the slowest of more (fewer) ranks arrives later (earlier)
        transfer = np.maximum(transfer + st.colls.dp_wait_shift_ns.to_numpy(np.int64), 0)
    barrier_ids = np.flatnonzero(g.kind == _graph.K["barrier"])
    st.dur_ns[barrier_ids[np.argsort(g.coll[barrier_ids])]] = transfer
    st.notes += [n for n in comm.notes if n not in st.notes]
    st.info.comm = comm
    if sc.network.changes_network or sc.parallelism.dp is not None:
        _overlap_note(g, sc, st)
    if isinstance(comm, OpticalModel):
        st.info.reconfigurations = int(comm.reconfigurations)
        _moot_optical_note(sc, st, comm.reconfigurations or (st.colls["n_hosts"].to_numpy(
            dtype="float64", na_value=np.nan) > 1).any())


def _moot_optical_note(sc: Scenario, st: ModelState, used: bool) -> None:
    if not used:
        st.notes.append(f"{sc.where}: [optical] changes nothing: every collective runs inside one host as the "
                        "run's hosts say (run.json, else the traces' host names); if the ranks ran on "
                        "several hosts, say which with [topology] ranks_per_host or hosts")


def _alpha_beta_only(sc: Scenario) -> str | None:
    """What of the scenario only the alpha-beta model costs (None: nothing)."""
    net = sc.network
    if net.algorithm is not None:
        return f"[network] algorithm = '{net.algorithm}'"
    if net.calibrate == "none":
        return "[network] calibrate = 'none' (the default links' absolute costs)"
    return None


def _overlap_note(g, sc: Scenario, st: ModelState) -> None:
    """The alpha-beta model costs each collective alone; where the run's transfers shared a link, say so and
    name the model that shares it."""
    lf = links.build(g.colls, _run_host_index(g))
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


def fit_links(g, sc: Scenario, run, st: ModelState):
    """(the run's transfers as flows, the links model's fit on them, the NICs' nominal rate in GB/s or None): capacity
    and latency per link class and a factor per transfer (replay/linkfit.py), fitted once a what-if."""
    if st.info.links_fit is not None:
        return st.info.links_fit
    net = sc.network
    measured = links.build(g.colls, _run_host_index(g))
    starts = g.colls.barrier_start_ns.to_numpy(np.int64)[measured.coll_row]
    bed = testbed_block(run)  # run.json's testbed block, read once: the tc rates, the round trip, the MTU
    rates = _testbed_rates(bed)
    nominal_gbps = net.nic_bandwidth_gbps or (min(rates.values()) / 8e3 if rates else None)  # a ring's slowest
    if net.calibrate == "nccl_tests":  # one collective at a time: the alpha-beta fit is each link alone
        end = starts + g.colls.measured_transfer_ns.to_numpy(np.int64)[measured.coll_row]
        fitted = replace(linkfit.from_alpha_beta(sc.calibrate(g.colls, st.nccl_tests)),
                         shared=links.overlapped(measured, starts, end))
    else:
        bucket = bucket_of(bed)  # the links' token bucket, where run.json knows it (the testbed's tc tbf)
        fitted = linkfit.fit(measured, starts, g.colls.measured_transfer_ns.to_numpy(np.int64)[measured.coll_row],
                             g.colls.op.astype(object).to_numpy()[measured.coll_row],
                             latency_bound_ns=latency_bound(bed, net, nominal_gbps), frame_bytes=_mtu_bytes(bed),
                             known_burst={links.INTER: bucket[0]} if bucket else None,
                             nominal={links.INTER: nominal_gbps * payload_share(bed)} if nominal_gbps else None)
        if bucket:
            _depth, depth_at, rate_mbit = bucket
            fitted = replace(fitted, burst_at=lambda x: float(depth_at(rate_mbit * x)))
    st.info.links_fit = (measured, fitted, nominal_gbps)
    return st.info.links_fit


def scenario_link_params(g, sc: Scenario, fitted: linkfit.Fit, host_of=None) -> links.LinkParams:
    """The fitted link parameters as the scenario's [network] changes them."""
    net = sc.network
    over = net.packet_links
    prm = fitted.params.scaled(
        bandwidth=net.bandwidth_scale, latency=net.latency_scale,
        class_scale={c: o.bandwidth_scale for c, o in over.items() if o.bandwidth_scale is not None},
        capacity={c: o.bandwidth_gbps for c, o in over.items() if o.bandwidth_gbps is not None},
        latency_ns={c: o.latency_us * 1e3 for c, o in over.items() if o.latency_us is not None},
        host_scale=_host_scales(net.hosts, _host_index(g, sc) if host_of is None else host_of, sc.where))
    if fitted.burst_at is not None and links.INTER in prm.burst:
        # a known bucket (the testbed's) at the links' new rate: the rule the run's shaper sets it by
        x = prm.capacity[links.INTER] / fitted.params.capacity[links.INTER]
        prm = replace(prm, burst={**prm.burst, links.INTER: fitted.burst_at(x)})
    return prm


def links_step(g, sc: Scenario, run, st: ModelState) -> None:
    """[network] model = 'links': every collective a flow over the hosts' links (replay/links.py), capacity and
    latency per link class fitted on the measured run's own transfers and a factor per transfer that keeps its
    measured time (replay/linkfit.py), then changed as the scenario says."""
    host_of = _host_index(g, sc)
    measured, fitted, nominal_gbps = fit_links(g, sc, run, st)
    rates = _testbed_rates(testbed_block(run))
    prm = scenario_link_params(g, sc, fitted, host_of)
    on_circuit, reconfig_ns = None, np.zeros(len(st.colls), np.int64)
    if sc.optical is not None:
        plan = sc.optical.model(None).plan(st.colls)
        on_circuit, reconfig_ns = plan.on_circuit, plan.reconfig_ns
        prm = _with_circuits(prm, fitted, sc, nominal_gbps, st.notes)
        st.info.reconfigurations = int(plan.reconfigurations)
    lf = links.build(st.colls, _extend(host_of, st.colls), on_circuit)
    if sc.optical is not None:
        _moot_optical_note(sc, st, plan.reconfigurations or (lf.link_class == links.OPTICAL).any())
    resized = st.colls.group_size.to_numpy() != g.colls.group_size.to_numpy()  # a data-parallel change
    factor, tail, share = linkfit.carry(measured, fitted, lf, resized)
    barrier = np.flatnonzero(g.kind == _graph.K["barrier"])
    node_of = barrier[np.argsort(g.coll[barrier])]  # barrier node of each collective row
    flows = lf.flows(node_of[lf.coll_row], prm, factor, share)
    # the slowest of more (fewer) ranks arrives later (earlier); a circuit switch reconfigures before it starts
    shift = reconfig_ns + (st.colls.dp_wait_shift_ns.to_numpy(np.int64) if "dp_wait_shift_ns" in st.colls else 0)
    if shift.any():
        flows = Flows(flows.node, flows.bytes, np.maximum(flows.latency_ns + shift[lf.coll_row], 0), flows.route_ptr,
                      flows.route_links, flows.capacity, flows.burst)
    shared = np.zeros(len(st.colls), bool)  # per collective row (the scenario's follow the run's)
    shared[measured.coll_row] = fitted.shared
    _scale_release_lags(g, st, lf, flows, lf.flows(flows.node, _as_run(fitted, prm), factor, share), node_of, tail,
                        shared)
    rest = np.setdiff1d(np.arange(len(st.colls)), lf.coll_row)
    st.dur_ns[node_of[rest]] = st.colls.measured_transfer_ns.to_numpy(np.int64)[rest] + reconfig_ns[rest]
    st.info.flows = flows
    st.info.links = fitted
    pooled = pools.gloo_pools(g, st.lag_ns)
    if pooled is not None:
        st.info.edge_src, st.info.edge_from_end, st.lag_ns, st.info.pools, n_jobs = pooled
        st.notes.append(f"gloo worker threads as a pool: {n_jobs} collective(s) run on whichever of their group's "
                        "runloop threads is free, in the order they were enqueued")
    for c in sorted(set(lf.link_class)):
        if fitted.source.get(c) == "default":
            d = fitted.params
            st.notes.append(f"links model: no transfer of the run crossed an {c} link, this scenario's do: they get "
                            f"the default {d.capacity[c]:g} GB/s and {d.latency_ns[c] / 1e3:g} us (replay/costs.py "
                            "DEFAULT_LINKS; [network.links.<class>] bandwidth_gbps says otherwise)")
    for c, rms in fitted.rel_rms.items():
        how = fitted.source.get(c) or f"over {fitted.flows[c]} transfer(s)"
        nominal = _nominal_rates(rates) if c == links.INTER else ""
        st.notes.append(f"links model: {c} fitted {fitted.params.capacity[c] * 8e3:.4g} Mbit/s "
                        f"({fitted.params.capacity[c]:.4g} GB/s), latency {fitted.params.latency_ns[c] / 1e3:.4g} us per "
                        f"step{_software(fitted.params, c)}, from {how} (the model alone {100 * rms:.1f}% rms off the "
                        f"measured transfers; each transfer keeps the rest as its own factor){nominal}")
    off = _off_nominal(fitted, nominal_gbps)
    if off:
        st.notes.append(off)
    st.notes += [n for n in fitted.notes + lf.notes if n not in st.notes]


def _software(prm: links.LinkParams, c: str) -> str:
    """ ' and N us of software', where the fit split software time per step from class c's latency."""
    over = prm.overhead_ns.get(c, 0.0)
    return f" and {over / 1e3:.4g} us of software" if over else ""


# a fitted NIC capacity further than this from the NICs' nominal rate is a failed fit, and said so
NOMINAL_TOLERANCE = 0.10


def _off_nominal(fitted: linkfit.Fit, nominal_gbps: float | None) -> str | None:
    """A note where the fitted inter_node capacity is far from the NICs' nominal rate (known from [network]
    nic_bandwidth_gbps or run.json's testbed): the run's transfers did not identify the link."""
    if not nominal_gbps or links.INTER not in fitted.rel_rms:
        return None
    got = fitted.params.capacity[links.INTER]
    if abs(got / nominal_gbps - 1.0) <= NOMINAL_TOLERANCE:
        return None
    return (f"links model: the fit failed to identify the hosts' NICs: {got * 8e3:.4g} Mbit/s is "
            f"{100 * (got / nominal_gbps - 1.0):+.0f}% off their nominal {nominal_gbps * 8e3:.4g} Mbit/s (the transfers' "
            "times carry more than the link: CPU on a busy machine, one size that cannot tell latency from rate); a "
            "scenario that changes the links carries that error")


def _with_circuits(prm: links.LinkParams, fitted: linkfit.Fit, sc: Scenario, nominal: float | None,
                   notes: list) -> links.LinkParams:
    """The parameters with the [optical] circuits' class: a circuit's nominal rate at the efficiency the run's
    NICs reached (fitted capacity over their nominal rate, GB/s; None: unknown), so that a circuit at the NICs' own
    rate is the run's link; a rate left unset is the scenario's inter_node capacity. A latency given is the
    circuits' own."""
    opt, fit_inter = sc.optical, fitted.params.capacity[links.INTER]
    cap = prm.capacity[links.INTER]
    if opt.circuit_bandwidth_gbps is not None:
        if nominal is None or fitted.source.get(links.INTER) == "default":
            cap = opt.circuit_bandwidth_gbps
            notes.append(f"{sc.where}: [optical] circuits get their nominal {cap:g} GB/s: the run's NIC rate is "
                         "unknown (give [network] nic_bandwidth_gbps, the NICs' rate as sold, to give them the "
                         "efficiency the run's links reached)")
        else:
            cap = fit_inter * (opt.circuit_bandwidth_gbps / nominal)  # at the NICs' rate: the fitted float
            notes.append(f"{sc.where}: [optical] circuits at {opt.circuit_bandwidth_gbps:g} GB/s carry "
                         f"{cap:.4g} GB/s: the efficiency the run's NICs reached ({100 * fit_inter / nominal:.1f}% of "
                         f"their {nominal:.4g} GB/s), shared as a NIC is")
    lat = prm.latency_ns[links.INTER] if opt.circuit_latency_us is None else opt.circuit_latency_us * 1e3
    burst = dict(prm.burst)
    if fitted.burst_at is not None and links.INTER in burst:  # a known bucket: a circuit's at its rate, as a NIC's
        burst[links.OPTICAL] = fitted.burst_at(cap / fit_inter)
    return replace(prm, capacity={**prm.capacity, links.OPTICAL: cap}, latency_ns={**prm.latency_ns, links.OPTICAL: lat},
                   burst=burst)


# an Ethernet frame's header, and the frame where run.json names no MTU
ETH_HEADER_BYTES, DEFAULT_MTU_BYTES = 14, 1500
TCP_IP_HEADER_BYTES = 52  # IPv4 (20) and TCP with timestamps (32)


def latency_bound(bed: dict, net, nominal_gbps: float | None) -> dict[str, float] | None:
    """The most latency per step the hosts' links can have (ns, inter_node): their round trip ([network] rtt_us, else
    run.json's testbed rtt_us) and one frame's serialization at the NICs' nominal rate (the frame: run.json's
    testbed MTU, else 1500 bytes; with no nominal rate, the round trip alone). None where the round trip is unknown.
    bed: run.json's testbed block (testbed_block)."""
    rtt_us = net.rtt_us or bed.get("rtt_us")
    if not rtt_us:
        return None
    frame_ns = (_mtu_bytes(bed) + ETH_HEADER_BYTES) / nominal_gbps if nominal_gbps else 0.0
    return {links.INTER: float(rtt_us) * 1e3 + frame_ns}


def payload_share(bed: dict) -> float:
    """The share of a link's rate that carries a TCP stream's payload: a frame of the MTU (run.json's testbed MTU,
    else 1500 bytes; bed: its testbed block) less its IPv4 and TCP headers (with timestamps), over the frame with
    its Ethernet header (what a tc shaper counts): 99.3% with 9000-byte frames, 95.6% with 1500."""
    mtu = _mtu_bytes(bed)
    return (mtu - TCP_IP_HEADER_BYTES) / (mtu + ETH_HEADER_BYTES)


def _mtu_bytes(bed: dict) -> int:
    """The hosts' links' MTU: run.json's testbed MTU (bed: its testbed block), else 1500 bytes."""
    return int(bed.get("mtu") or DEFAULT_MTU_BYTES)


def testbed_block(run) -> dict:
    """run.json's testbed block ({} where there is none)."""
    try:
        bed = run.run_manifest().get("testbed")
    except AttributeError:
        return {}
    return bed if isinstance(bed, dict) else {}


def _testbed_rates(bed: dict) -> dict[int, float]:
    """Per host, the NIC rate (Mbit/s) the run was shaped to, where run.json's testbed block (bed) says (the tc
    rates)."""
    try:
        return {int(x["host"]): float(x["rate_mbit"]) for x in bed["links"]}
    except (KeyError, TypeError, ValueError):
        return {}


def _as_run(fitted: linkfit.Fit, prm: links.LinkParams) -> links.LinkParams:
    """The parameters the run's lags were measured under, for the scenario's links: the fit; a circuit port is the
    NIC it replaces (the fitted inter_node link; where the run crossed no NIC, nothing to compare: the circuit)."""
    if links.OPTICAL not in prm.capacity:
        return fitted.params
    was = (prm.capacity[links.OPTICAL] if fitted.source.get(links.INTER) == "default"
           else fitted.params.capacity[links.INTER])
    return replace(fitted.params, capacity={**fitted.params.capacity, links.OPTICAL: was})


def _scale_release_lags(g, st: ModelState, lf, flows, fit_flows, node_of, tail, shared) -> None:
    """After the shared transfer a participant still waits for its own side of it. Part of that is CPU: each of a
    ring's p - 1 hand-offs waits for a worker thread to wake (up to p - 1 times the run's typical wake-up, the
    median time a caller took to wake after its own side had finished); the rest is the last of its data still
    on the link, which follows the flow's bottleneck capacity, and is no longer than all of the flow's bytes take
    there, or than what can still be on them once the first participant finished (on_links_after_first_ns: the
    ranks of an all-reduce alone on alike links end together); what a lag has beyond that is CPU too (a rank
    descheduled on a busy machine). A caller woken later still than its own side finished woke up a thread: that
    part of its host-wait lag stays. Every one of them waits the transfer's tail (replay/linkfit.py; on a slower
    link, less what its token bucket hides of a lone transfer's: linkfit.tail_at), and so does a message queued
    behind the transfer on its pair's stream."""
    old, new = fit_flows.capacity, flows.capacity
    k = np.ones(len(node_of))
    most = np.full(len(node_of), np.inf)  # ns the flow's bytes take at its bottleneck, under the fit
    most_after = np.full(len(node_of), np.inf)  # ns of them that can be on the links after the first finisher
    ops = st.colls.op.astype(str).str.lower().to_numpy()
    extra = np.zeros(len(node_of), np.int64)
    for i in range(len(lf)):
        route = lf.route_links[lf.route_ptr[i]:lf.route_ptr[i + 1]]
        row = lf.coll_row[i]
        extra[row] = tail[i]
        if len(route):
            k[row] = old[route].min() / new[route].min()
            most[row] = fit_flows.bytes[i] / old[route].min()
            most_after[row] = on_links_after_first_ns(ops[row], fit_flows.bytes[i], lf.lat_steps[i], old[route],
                                                      bool(shared[row]))
            if not shared[row]:
                extra[row] = linkfit.tail_at(int(tail[i]), _bucket_fill_ns(fit_flows, route),
                                             _bucket_fill_ns(flows, route))
    bar = np.full(g.n_nodes, -1, np.int64)
    bar[node_of] = np.arange(len(node_of))
    rel = np.flatnonzero((g.edge_kind == _graph.E["release"]) & (bar[g.src] >= 0))
    # (barrier, rank): the release lag after the shared transfer's end (not an early finisher's, from its start)
    own = {(int(g.src[e]), int(g.rank[g.dst[e]])): int(st.lag_ns[e]) for e in rel if g.from_end[e]}
    hw = np.flatnonzero((g.edge_kind == _graph.E["host_wait"]) & (bar[g.src] >= 0))
    hw_net = np.array([min(int(st.lag_ns[e]), own.get((int(b), int(r)), 0))
                       for e, b, r in zip(hw, g.src[hw], g.rank[g.dst[hw]])], np.int64)
    woke = st.lag_ns[hw] - hw_net
    wake_ns = float(np.median(woke[woke > 0])) if (woke > 0).any() else 0.0
    hand_offs = np.maximum(st.colls.group_size.to_numpy(np.float64) - 1.0, 1.0)

    def split(lag, row, from_end):
        """lag = CPU part (kept) + link part (x k, at most what the flow's bytes can take there); early finishers'
        lags (from the start) are all transfer."""
        cpu = np.where(from_end, np.minimum(lag, hand_offs[row] * wake_ns), 0.0)
        link = np.minimum(lag - cpu, np.where(from_end, most_after[row], most[row]))
        return np.rint(lag - link + link * k[row]).astype(np.int64)

    row = bar[g.src[rel]]
    # the tail comes after the flow, where the barrier ends: an early finisher's lag (from the barrier's start) holds
    # the whole measured transfer, tail included
    st.lag_ns[rel] = split(st.lag_ns[rel].astype(np.float64), row, g.from_end[rel]) + np.where(g.from_end[rel],
                                                                                               extra[row], 0)
    # a message queued behind this one on the pair's stream (pair_order) goes once its tail is over too
    after = np.flatnonzero((g.edge_kind == _graph.E["pair_order"]) & (bar[g.src] >= 0))
    st.lag_ns[after] += extra[bar[g.src[after]]]
    if len(hw):
        row = bar[g.src[hw]]
        st.lag_ns[hw] = split(hw_net.astype(np.float64), row, np.ones(len(hw), bool)) + woke + extra[row]


def _bucket_fill_ns(fl, route) -> float:
    """ns the token bucket of a route's bottleneck link (fl: Flows; route: its links) takes to fill: its depth over
    its rate (0 where the links have none)."""
    if fl.burst is None:
        return 0.0
    cap = fl.capacity[route]
    neck = cap == cap.min()
    return float((fl.burst[route][neck] / cap[neck]).max())


def on_links_after_first_ns(op: str, nbytes: float, lat_steps: float, capacity: np.ndarray,
                            shared: bool) -> float:
    """ns a flow's bytes can still take on its links (capacity: theirs, bytes/ns) once its first participant has
    finished. An all-reduce that had its links to itself (shared: it did not, in the run) ends on a last ring step
    that hands every rank its last reduced chunk (bytes / steps) at once, each at its link's rate: a rank ends
    later only by what that chunk takes on the slowest link over the fastest, nothing where the links are alike
    (a 2-host TP run's 256 KiB all-reduces: the later rank 0.08 ms after the first at 50 Mbit/s, 0.24 ms at 400).
    One that shared them, with the next bucket's all-reduce on gloo's other thread, ends on each rank as the other
    transfer left it room (a 2-host DDP job behind 512 KB buckets: 53 ms apart at 50 Mbit/s, 1.4 ms at 800): that
    is the link's, as any other op's early finisher can leave with its peers' data still on the way: all of the
    flow's bytes."""
    if op in costs.REDUCE_OPS and not shared:
        chunk = nbytes / max(lat_steps, 1.0)
        return float(chunk / capacity.min() - chunk / capacity.max())
    return float(nbytes / capacity.min())


def _nominal_rates(rates: dict[int, float]) -> str:
    """The NIC rates the run was shaped to (_testbed_rates), for the notes."""
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
    if sc.topology.given:
        ranks = {int(r) for r in g.hosts["rank"]} | {int(r) for grp in g.colls["ranks"] for r in grp}
        return topology.host_of(sc.topology, ranks, sc.where)
    return _run_host_index(g)


def _run_host_index(g) -> dict[int, int]:
    """rank -> host index as the run ran (the graph's hosts: run.json, else the traces' host names)."""
    names: dict = {}  # ranks whose host nothing names share one unknown host, as the alpha-beta model takes them
    return {int(r): names.setdefault(h if isinstance(h, str) and h else None, len(names))
            for r, h in zip(g.hosts["rank"], g.hosts["hostname"])}


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


MODEL_STEPS = (topology_step, compute_step, memory_step, hardware_step, parallelism_step, comm_step)


def apply_models(g, scenario: Scenario | None, run=None):
    """Node durations and edge lags under the scenario's models (measured when scenario is None).
    Returns (dur_ns per node, lag_ns per edge, notes, ModelInfo)."""
    if scenario is None:
        return g.dur_ns.copy(), g.lag_ns.copy(), [], ModelInfo()
    st = ModelState(dur_ns=g.dur_ns.copy(), lag_ns=g.lag_ns.copy(), colls=g.colls,
                    rng=np.random.default_rng(scenario.seed), nccl_tests=_nccl_tests(run, scenario))
    for step in MODEL_STEPS:
        step(g, scenario, run, st)
    return np.maximum(st.dur_ns, 0), st.lag_ns, st.notes, st.info
