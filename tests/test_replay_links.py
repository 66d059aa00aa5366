"""[network] model = 'links': collectives as flows over the hosts' links, fitted on the run's own transfers.
Checked against what the testbed runs were recorded under (their tc rates), and the per-host NIC key."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

import replay
import tracekit
from replay import linkfit, links
from replay.scenario import ScenarioError, scenario_from_dict

from .conftest import REPO

SAMPLES = REPO / "sample_traces"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("links")
    return {name: tracekit.open(str(SAMPLES / name), store=str(tmp / name))
            for name in ("ddp2_2hosts_100mbit", "ddp2_2hosts_400mbit", "ddp4_loopback")}


@pytest.mark.parametrize("name, mbit", [("ddp2_2hosts_100mbit", 100), ("ddp2_2hosts_400mbit", 400)])
def test_the_fitted_nic_capacity_is_the_rate_the_run_was_shaped_to(runs, name, mbit):
    # the testbed's tc tbf rate is the ground truth the fit never sees (run.json's testbed block)
    res = replay.run(runs[name], scenario_from_dict({"network": {"model": "links", "latency_scale": 1.0}}, "x"))
    fit = res.info.links
    assert runs[name].run_manifest()["testbed"]["links"][0]["rate_mbit"] == mbit
    assert fit.params.capacity["inter_node"] * 8e3 == pytest.approx(mbit, rel=0.10)
    # the notes print the fit beside the rate the run was shaped to
    assert any("links model: inter_node fitted" in n and f"nominal {mbit} Mbit/s (the testbed's tc rate" in n
               for n in res.notes)


def test_a_fit_far_from_the_nics_nominal_rate_is_reported_as_failed(runs):
    run = runs["ddp2_2hosts_100mbit"]
    fine = replay.run(run, scenario_from_dict({"network": {"bandwidth_scale": 2.0}}, "x"))
    assert not any("failed to identify" in n for n in fine.notes)  # 100 Mbit/s shaped, fitted within 10%
    # told the NICs are sold as 200 Mbit/s, the same fit is half of that: a failed fit, said so
    told = replay.run(run, scenario_from_dict({"network": {"bandwidth_scale": 2.0, "nic_bandwidth_gbps": 0.025}}, "x"))
    assert any("failed to identify the hosts' NICs" in n and "off their nominal 200 Mbit/s" in n for n in told.notes)


def test_links_what_if_moves_transfers_as_flows_and_a_slow_host_bottlenecks_its_ring(runs):
    run = runs["ddp2_2hosts_100mbit"]
    all_slow = replay.run(run, scenario_from_dict({"network": {"model": "links", "bandwidth_scale": 0.25}}, "x"))
    one_slow = replay.run(run, scenario_from_dict(
        {"network": {"model": "links", "hosts": [{"ranks": [1], "bandwidth_scale": 0.25}]}}, "y"))
    base = replay.run(run).summary().measured_step_ns.max()
    assert len(all_slow.info.flows) == len(run_colls_with_bytes(all_slow))
    # a two-host ring runs at the pace of its slower NIC: one slow host costs what all slow hosts cost
    assert one_slow.summary().predicted_step_ns.max() == all_slow.summary().predicted_step_ns.max()
    assert all_slow.summary().predicted_step_ns.max() > 2.5 * base


def run_colls_with_bytes(res):
    c = res.graph.colls
    return c[c.bytes.notna() & (c.group_size > 1)]


def test_per_host_links_need_the_links_model_and_ranks_of_the_run(runs):
    with pytest.raises(ScenarioError, match=r"\[\[network.hosts\]\] #1 ranks: per-host links need the shared-link model"):
        scenario_from_dict({"network": {"model": "alpha_beta", "hosts": [{"ranks": [1], "bandwidth_scale": 0.5}]}},
                           "h.toml")
    scenario_from_dict({"network": {"hosts": [{"ranks": [1], "bandwidth_scale": 0.5}]}}, "h.toml")  # the default
    with pytest.raises(ScenarioError, match=r"\[\[network.hosts\]\] #1 ranks: missing"):
        scenario_from_dict({"network": {"model": "links", "hosts": [{"bandwidth_scale": 0.5}]}}, "h.toml")
    sc = scenario_from_dict({"network": {"model": "links", "hosts": [{"ranks": [7], "bandwidth_scale": 0.5}]}}, "h.toml")
    with pytest.raises(ScenarioError, match=r"#1 ranks: rank 7 is not a rank of the run"):
        replay.run(runs["ddp2_2hosts_100mbit"], sc)


def test_flows_by_hand_ring_bytes_routes_and_unknown_sizes():
    import pandas as pd

    colls = pd.DataFrame({"op": ["all_reduce", "all_reduce", "all_gather", "all_reduce"],
                          "bytes": pd.array([1000, 1000, 400, None], dtype="Int64"),
                          "group_size": [2, 4, 4, 2], "ranks": [[0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1]]})
    lf = links.build(colls, {0: 0, 1: 0, 2: 1, 3: 1})
    assert lf.coll_row.tolist() == [0, 1, 2]  # the one without bytes keeps its measured transfer
    assert lf.link_class.tolist() == ["intra_node", "inter_node", "inter_node"]
    assert lf.bytes.tolist() == [1000.0, 1500.0, 300.0]  # 2(p-1)/p n and (p-1)/p n per link
    assert lf.lat_steps.tolist() == [2.0, 6.0, 3.0]
    # two hosts' NICs both ways, plus every rank's port since each host holds two of the ranks
    route = lf.route_links[lf.route_ptr[1]:lf.route_ptr[2]]
    assert sorted(lf.link_names[i] for i in route)[:4] == ["host0.nic.rx", "host0.nic.tx", "host1.nic.rx",
                                                           "host1.nic.tx"]
    assert len(route) == 4 + 8
    assert any("without a byte count" in n for n in lf.notes)
    prm = links.LinkParams({"intra_node": 2.0, "inter_node": 0.5}, {"intra_node": 10.0, "inter_node": 100.0})
    t = linkfit.transfers(lf, np.array([0, 10_000, 10_000]), prm)
    assert t[0] == 20 + 500  # alone on its ports: 2 latency steps + 1000 bytes at 2 bytes/ns
    # both start at 10 us and cross both hosts' NICs (0.5 bytes/ns): the all-gather moves after its 300 ns of
    # latency, alone at 0.5 for 300 ns (150 bytes), then shares with the all-reduce (moving from 600 ns) at 0.25
    # each: its last 150 bytes take 600 ns (ends 1200 ns after the start); the all-reduce has 1350 bytes left
    # then, alone at 0.5: 2700 ns more (ends at 3900)
    assert t[2] == 1200 and t[1] == 3900


def test_a_collective_on_circuits_crosses_the_hosts_circuit_ports_not_their_nics():
    import pandas as pd

    colls = pd.DataFrame({"op": ["all_reduce", "all_reduce", "send"], "bytes": pd.array([1000, 1000, 800], dtype="Int64"),
                          "group_size": [2, 2, 2], "ranks": [[0, 1], [0, 1], [0, 1]]})
    lf = links.build(colls, {0: 0, 1: 1}, on_circuit=np.array([True, False, True]))
    assert lf.link_class.tolist() == ["optical", "inter_node", "optical"]
    names = [sorted(lf.link_names[i] for i in lf.route_links[lf.route_ptr[k]:lf.route_ptr[k + 1]]) for k in range(3)]
    assert names == [["host0.circuit.rx", "host0.circuit.tx", "host1.circuit.rx", "host1.circuit.tx"],
                     ["host0.nic.rx", "host0.nic.tx", "host1.nic.rx", "host1.nic.tx"],
                     ["host0.circuit.tx", "host1.circuit.rx"]]  # a message out of the sender, into the receiver
    # circuits of their own class, shared as NICs are and slowed with their host; without an optical class of
    # their own they are the inter_node links
    prm = links.LinkParams({"intra_node": 2.0, "inter_node": 0.5, "optical": 2.0},
                           {"intra_node": 10.0, "inter_node": 100.0, "optical": 1.0}, host_scale={1: 0.5})
    fl = lf.flows(np.arange(3), prm)
    by_name = dict(zip(lf.link_names, fl.capacity))
    assert by_name["host0.circuit.tx"] == 2.0 and by_name["host1.circuit.rx"] == 1.0 and by_name["host0.nic.tx"] == 0.5
    assert fl.latency_ns.tolist() == [2, 200, 1]
    plain = lf.flows(np.arange(3), links.LinkParams({"intra_node": 2.0, "inter_node": 0.5},
                                                    {"intra_node": 10.0, "inter_node": 100.0}))
    assert plain.capacity.tolist() == [0.5] * 8 and plain.latency_ns.tolist() == [200, 200, 100]


def _lone_transfers_behind(burst):
    """24 lone all-reduces of 0.4-1.6 MB between two hosts, 1-10 ms apart, timed by the engine on a 100 Mbit/s link
    behind a token bucket of `burst` bytes (0: none)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    sizes = rng.choice([400e3, 800e3, 1600e3], 24)
    colls = pd.DataFrame({"op": ["all_reduce"] * 24, "bytes": pd.array(sizes.astype(int), dtype="Int64"),
                          "group_size": [2] * 24, "ranks": [[0, 1]] * 24})
    lf = links.build(colls, {0: 0, 1: 1})
    cap = 100 / 8e3  # bytes per ns
    truth = links.LinkParams({"intra_node": 10.0, "inter_node": cap}, {"intra_node": 0.0, "inter_node": 0.0},
                             burst={"inter_node": float(burst)} if burst else {})
    starts = np.cumsum(np.r_[0, sizes[:-1] / cap + rng.choice([1e6, 3e6, 10e6], 23)]).astype(np.int64)
    return lf, starts, linkfit.transfers(lf, starts, truth)


def test_the_fit_finds_a_token_bucket_and_the_rate_behind_it_and_none_where_there_is_none():
    # without a bucket in the model, transfers after an idle spell (100 KB past the rate) would make the link look
    # faster than its 100 Mbit/s
    lf, starts, measured = _lone_transfers_behind(100e3)
    fit = linkfit.fit(lf, starts, measured, np.array(["all_reduce"] * len(lf), dtype=object))
    assert fit.params.capacity["inter_node"] * 8e3 == pytest.approx(100, rel=0.01)
    assert fit.params.burst["inter_node"] == pytest.approx(100e3, rel=0.05)
    assert "token bucket" in fit.source["inter_node"]
    lf, starts, measured = _lone_transfers_behind(0)
    fit = linkfit.fit(lf, starts, measured, np.array(["all_reduce"] * len(lf), dtype=object))
    assert fit.params.burst == {} and fit.params.capacity["inter_node"] * 8e3 == pytest.approx(100, rel=0.01)


def test_one_size_transfers_behind_a_known_bucket_give_the_rate_behind_it():
    # a pipeline's 64 KiB messages, 1-10 ms apart on a 400 Mbit/s link behind the testbed's 25 KB bucket: each gets
    # 25 KB through at once, so alone they look 1.6x the rate, and one size cannot tell a bucket from a rate. Told
    # the bucket (run.json's testbed block), the fit gives the rate back and keeps the depth
    import pandas as pd

    rng = np.random.default_rng(1)
    n, size, cap = 24, 65536, 400 / 8e3
    colls = pd.DataFrame({"op": ["send"] * n, "bytes": pd.array([size] * n, dtype="Int64"), "group_size": [2] * n,
                          "ranks": [[0, 1]] * n})
    lf = links.build(colls, {0: 0, 1: 1})
    truth = links.LinkParams({"intra_node": 10.0, "inter_node": cap}, {"intra_node": 0.0, "inter_node": 0.0},
                             burst={"inter_node": 25e3})
    starts = np.cumsum(np.r_[0, np.full(n - 1, size / cap) + rng.choice([1e6, 3e6, 10e6], n - 1)]).astype(np.int64)
    measured = linkfit.transfers(lf, starts, truth)
    ops = np.array(["send"] * n, dtype=object)
    blind = linkfit.fit(lf, starts, measured, ops)
    assert blind.params.capacity["inter_node"] / cap == pytest.approx(size / (size - 25e3), rel=0.01)
    told = linkfit.fit(lf, starts, measured, ops, known_burst={"inter_node": 25e3})
    assert told.params.capacity["inter_node"] / cap == pytest.approx(1.0, rel=0.01)
    assert told.params.burst == {"inter_node": 25e3} and "(run.json)" in told.source["inter_node"]
    assert (told.factor == pytest.approx(1.0, rel=0.01)) and (told.tail_ns <= 1).all()


def test_the_testbed_bucket_follows_its_rule_at_another_rate_unless_it_was_given():
    from tracekit.shaping import bucket_of

    def bed(rate, burst, frames="jumbo"):
        return {"frames": frames, "links": [{"host": h, "rate_mbit": rate, "burst_bytes": burst} for h in (0, 1)]}

    depth, at, rate = bucket_of(bed(400, 25000))  # the jumbo kind's default: 0.5 ms of traffic, two frames at least
    assert (depth, rate, at(100), at(800)) == (25000, 400, 18028, 50000)
    depth, at, rate = bucket_of(bed(400, 256000))  # given (--link-burst-kb): the same depth at every rate
    assert (depth, at(100), at(800)) == (256000, 256000, 256000)
    assert bucket_of({}) is None and bucket_of(bed(None, None)) is None


def test_gloo_worker_threads_become_one_pool_per_rank(runs):
    from analyses import depgraph
    from replay.pools import gloo_pools

    g = depgraph.build(runs["ddp2_2hosts_100mbit"])
    src, from_end, lag, (acquire, release, servers), jobs = gloo_pools(g, g.lag_ns)
    threads = g.tracks[~g.tracks.is_gpu].merge(
        g.tracks.iloc[np.unique(g.track[(g.kind == depgraph.K["comm"])])][["track"]], on="track")
    assert servers.tolist() == threads.groupby("rank").size().tolist()  # one server per runloop thread
    assert jobs == (acquire >= 0).sum() == (release >= 0).sum() > 0
    # every job gives its server back at its own end (its comm_exit), and its thread edge binds no more
    assert np.array_equal(np.flatnonzero(release >= 0), np.flatnonzero(acquire >= 0) + 1)
    into_jobs = (g.edge_kind == depgraph.E["thread"]) & (acquire[g.dst] >= 0)
    assert into_jobs.sum() > 0 and not from_end[into_jobs].any() and (lag[into_jobs] == 0).all()
    assert ((src != g.src) | (from_end != g.from_end))[~into_jobs].sum() == 0  # no other edge moves
    # in their place each job follows the rank's previous job in enqueue order, from its start: first in,
    # first out (a long hand-off delay cannot put a job behind later ones; the ranks would deadlock)
    enq = (g.edge_kind == depgraph.E["enqueue"]) & (acquire[g.dst] >= 0)
    at = dict(zip(g.dst[enq], g.start_ns[g.src[enq]]))
    for r in np.unique(g.rank[acquire >= 0]):
        order = sorted((at[j], j) for j in np.flatnonzero((acquire >= 0) & (g.rank == r)))
        prev = {j: (order[i - 1][1] if i else 0) for i, (_, j) in enumerate(order)}
        for edge in np.flatnonzero(into_jobs & (g.rank[g.dst] == r)):
            assert src[edge] == prev[g.dst[edge]]
    res = replay.run(runs["ddp2_2hosts_100mbit"], scenario_from_dict({"network": {"model": "links"}}, "x"))
    assert res.info.pools is not None and any("gloo worker threads as a pool" in n for n in res.notes)
    s = res.summary()
    assert abs(s.predicted_step_ns.max() - s.measured_step_ns.max()) <= 0.03 * s.measured_step_ns.max()


def test_links_calibrated_from_nccl_tests_rows(tmp_path):
    # an nccl-tests curve of the 2-host testbed's all-reduce at 100 Mbit/s (12.5 MB/s, 200 us per latency
    # step): the links model takes its capacity from it instead of from the run, and so does a replay with
    # the alpha-beta model (both need the store's rows, which the replay now passes)
    import shutil

    from .test_nccl import nccl_tests_json

    d = tmp_path / "ddp2"
    shutil.copytree(SAMPLES / "ddp2_2hosts_100mbit", d, ignore=shutil.ignore_patterns(".tracekit"))
    rows = [(s, 2 * 200 + s / 12.5, 0.0) for s in (1 << 18, 1 << 20, 1 << 22)]  # time in us
    ref = nccl_tests_json(tmp_path / "ar.json", rows)
    run = tracekit.open(str(d), store=str(tmp_path / "st"), nccl_tests=[str(ref)])
    doc = {"network": {"model": "links", "calibrate": "nccl_tests", "nccl_tests_group_size": 2, "nccl_tests_hosts": 2}}
    res = replay.run(run, scenario_from_dict(doc, "x"))
    fit = res.info.links
    # the alpha-beta fit of the rows, taken as the links' capacity and latency (the rows' in-place half is
    # 10% slower, as the helper writes it: the fit lands between the two halves)
    from replay.calibration import calibrate_nccl_tests

    ab_fit = calibrate_nccl_tests(run.sql("SELECT * FROM nccl_tests"), group_size=2, n_hosts=2)
    assert fit.params.capacity["inter_node"] == ab_fit.links["inter_node"].bandwidth_gbps
    assert fit.params.latency_ns["inter_node"] == ab_fit.links["inter_node"].alpha_ns
    assert fit.params.capacity["inter_node"] == pytest.approx(0.0125, rel=0.1)
    assert any("from nccl-tests" in n for n in res.notes)
    ab = {"network": {"calibrate": "nccl_tests", "nccl_tests_group_size": 2, "nccl_tests_hosts": 2,
                      "bandwidth_scale": 2.0}}
    assert replay.run(run, scenario_from_dict(ab, "y")).summary().predicted_step_ns.max() > 0


def test_the_fit_takes_the_links_throughput_whatever_the_sharing_discipline():
    import pandas as pd

    # two 1 MB all-reduces across 2 hosts start together on a 0.01 byte/ns link and were served one after the
    # other (one TCP connection: first in, first out), not max-min: they ended at 100 and 200 ms. Their busy
    # period is 200 ms whatever the discipline, so the fit finds the link's capacity; fitting each flow's own
    # time under max-min (both would end at 200 ms) lands between. A 0.5 MB one alone later, in 50 ms, says
    # that no latency is in it
    colls = pd.DataFrame({"op": ["all_reduce"] * 3, "bytes": pd.array([1_000_000] * 2 + [500_000], dtype="Int64"),
                          "group_size": [2, 2, 2], "ranks": [[0, 1]] * 3})
    lf = links.build(colls, {0: 0, 1: 1})
    starts, measured = np.array([0, 0, 300_000_000]), np.array([100_000_000, 200_000_000, 50_000_000])
    fit = linkfit.fit(lf, starts, measured)
    assert fit.params.capacity["inter_node"] == pytest.approx(0.01, rel=0.01)
    assert fit.params.latency_ns["inter_node"] == 0
    # max-min has both shared ones end at 200 ms: each keeps what the model misses as its own factor (the first
    # moves less, the second more), so that with nothing changed every flow takes its measured time
    assert fit.rel_rms["inter_node"] > 0.1 and fit.factor[0] < 1 < fit.factor[1]
    assert (linkfit.transfers(lf, starts, fit.params, fit.factor) + fit.tail_ns == measured).all()
    ms = 1_000_000
    ends = links.period_ends(lf, np.array([0, 0, 300]) * ms, np.array([100, 200, 350]) * ms)
    assert ends.tolist() == [200 * ms, 200 * ms, 350 * ms]
    # a flow that starts before the link went idle is in its busy period; one that starts after opens its own
    ends = links.period_ends(lf, np.array([0, 150, 300]) * ms, np.array([100, 250, 350]) * ms)
    assert ends.tolist() == [100 * ms, 250 * ms, 350 * ms]
    ends = links.period_ends(lf, np.array([0, 50, 300]) * ms, np.array([100, 250, 350]) * ms)
    assert ends.tolist() == [250 * ms, 250 * ms, 350 * ms]


def test_busy_periods_are_the_measured_ones_and_a_hair_wide_gap_is_no_idle_link():
    import pandas as pd

    # three 1 MB all-reduces: two served back to back (0-200 ms), the third starting after the link went idle.
    # The predicted times are scored on the measured periods: re-partitioned, a period that ended just before
    # the next flow would swallow it as soon as a candidate capacity is slightly slow (its end jumping by that
    # flow's whole time), and the fit would run to whatever capacity keeps the gap
    colls = pd.DataFrame({"op": ["all_reduce"] * 3, "bytes": pd.array([1_000_000] * 3, dtype="Int64"),
                          "group_size": [2, 2, 2], "ranks": [[0, 1]] * 3})
    lf = links.build(colls, {0: 0, 1: 1})
    ms = 1_000_000
    starts = np.array([0, 0, 201 * ms])  # 1 ms idle before the third
    measured = links.busy_periods(lf, starts, starts + np.array([100, 200, 100]) * ms)
    slower = starts + np.array([101, 202, 101]) * ms  # the same flows 1% slower: the gap closes
    assert links.period_ends(lf, starts, slower).tolist() == [302 * ms] * 3
    assert links.period_ends(lf, starts, slower, measured).tolist() == [202 * ms, 202 * ms, 302 * ms]
    fit = linkfit.fit(lf, starts, np.array([100, 200, 100]) * ms)
    assert fit.params.capacity["inter_node"] == pytest.approx(0.01, rel=0.01)
    # a gap shorter than a woken caller's delay (30 us) is no idle link: one period on each of the 4 links
    # (both hosts' NICs, both ways), where the 1 ms gap made two
    hair = np.array([0, 0, 200 * ms + 30_000])
    assert len(set(links.busy_periods(lf, hair, hair + np.array([100, 200, 100]) * ms))) == 4
    assert len(set(measured)) == 8


def test_a_gloo_callers_wake_up_goes_to_the_collective_that_caused_it():
    import importlib

    import pandas as pd

    coll = importlib.import_module("analyses.depgraph.collectives")
    ms = 1_000_000
    # DDP's finalize on one rank: buckets X (runloop work 0-100 ms) and Y (10-200 ms) were both in flight; the
    # caller waited for X (idle 5-100.01), copied X's gradients (to 110), then waited for Y (idle 110-200.02)
    rows = pd.DataFrame({"match_key": ["x", "y"], "rank": [0, 0], "timeline": ["cpu", "cpu"],
                         "call_pid": [1, 1], "call_tid": [1, 1], "end_ns": [100 * ms, 200 * ms],
                         "nested_end_ns": pd.array([None, None], dtype="Int64")})
    busy_starts = np.array([0, 100 * ms + 10_000, 200 * ms + 20_000])
    busy_ends = np.array([5 * ms, 110 * ms, 210 * ms])
    last_arrival = pd.Series({"x": 0, "y": 10 * ms})
    wakes, began = coll._wake_times(rows, last_arrival, {(0, 1, 1): (busy_starts, busy_ends)})
    assert wakes.tolist() == [100 * ms + 10_000, 200 * ms + 20_000]
    assert began.tolist() == [5 * ms, 110 * ms]  # each wait is left out of the thread's pieces from there
    # a caller that never went idle while Y ran has no wake for it; X's stays X's
    wakes, _ = coll._wake_times(rows, last_arrival, {(0, 1, 1): (busy_starts[:2], np.array([5 * ms, 250 * ms]))})
    assert wakes.tolist() == [100 * ms + 10_000, -1]
    # a runloop whose annotation ends 5.3 ms after the caller woke (a worker descheduled on a busy machine;
    # a recorded 50 Mbit/s run): the wake is the end of the caller's long wait for Y, not of the hair of a
    # gap inside the optimizer step after it (that kept the 190 ms wait as a fixed gap in every what-if)
    rows["end_ns"] = [100 * ms, 300 * ms]
    busy_starts = np.array([0, 100 * ms + 10_000, 294_700_000, 296_500_000])
    busy_ends = np.array([5 * ms, 110 * ms, 296 * ms, 310 * ms])
    wakes, _ = coll._wake_times(rows, last_arrival, {(0, 1, 1): (busy_starts, busy_ends)})
    assert wakes.tolist() == [100 * ms + 10_000, 294_700_000]


def _late_lags(run, scale):
    """The graph, the edges of participants done after the shared transfer (release and host-wait lags over 1 ms),
    those edges' lags less their transfer's tail with the links scale times as fast, and the tails."""
    from analyses import depgraph
    from replay.model_steps import _run_host_index, apply_models

    g = depgraph.build(run)
    late = (((g.edge_kind == depgraph.E["release"]) & g.from_end) | (g.edge_kind == depgraph.E["host_wait"])) & (
        g.lag_ns > 1_000_000)
    _, lag, _, info = apply_models(g, scenario_from_dict({"network": {"bandwidth_scale": scale}}, "s.toml"), run)
    tail = dict(zip(links.build(g.colls, _run_host_index(g)).coll_row, info.links.tail_ns))
    extra = np.array([tail.get(c, 0) for c in g.coll[g.src]])
    return g, late, lag - extra, extra


def _op_of(g):
    """Each edge's source collective's op ('' for an edge from a node of no collective)."""
    return np.where(g.coll[g.src] >= 0, g.colls.op.to_numpy()[np.maximum(g.coll[g.src], 0)], "")


def _all_reduce_late_lags(path, store, scale):
    """A sample's all-reduce edges done after the shared transfer (at least 4; with nothing changed each keeps its
    lag, less its tail): their measured lags, their lags with the links scale times as fast, and the tails at
    either scale."""
    run = tracekit.open(str(path), store=str(store))
    g, late, same, tails = _late_lags(run, 1.0)
    late &= _op_of(g) == "all_reduce"
    assert late.sum() >= 4
    assert (same[late] == g.lag_ns[late]).all()
    _, _, scaled, tails_scaled = _late_lags(run, scale)
    return g.lag_ns[late], scaled[late], tails, tails_scaled


def test_an_all_reduce_alone_on_alike_links_ends_together_what_its_late_rank_waits_is_cpu(tmp_path):
    # a 2-host all-reduce that had the links to itself gives its ranks their last reduced chunk on one step: a rank
    # done later than the other waited for its threads, not its link (a 2-rank TP run's 256 KiB all-reduces: the
    # later rank's lag was a median 80 us at 50 Mbit/s and 240 us at 400), so faster links keep every such lag,
    # and each waits its transfer's tail as well
    lag, slower, _, _ = _all_reduce_late_lags(SAMPLES / "layouts" / "tp_2hosts_400mbit", tmp_path / "s", 0.25)
    assert (slower == lag).all()


def test_an_all_reduce_that_shared_its_links_ends_as_the_other_transfer_left_it_room(tmp_path):
    # DP x PP on 2 hosts: the two stages' data-parallel all-reduces cross the same NICs at once, and a rank ends
    # as the other transfer left it room (DDP's buckets on gloo's two worker threads behind 512 KB buckets: 53 ms
    # apart at 50 Mbit/s, 1.4 ms at 800): with the links twice as fast that lag shrinks, no further than by half,
    # and a caller's wake-up after its own side finished stays
    lag, faster, tails, tails_faster = _all_reduce_late_lags(SAMPLES / "layouts" / "dp_pp_2hosts_100mbit",
                                                             tmp_path / "s", 2.0)
    assert (faster <= lag).all() and (faster >= lag // 2).all()
    assert (faster < lag).any()
    assert np.array_equal(tails, tails_faster)  # a transfer's tail is its own: the links do not shrink it


def test_a_gathers_late_rank_waits_on_the_links_too(tmp_path):
    # FSDP's 2-rank all-gathers: the rank that arrived first leaves last, its peer's shard still on the link
    # (at 100 Mbit/s, 11-16 ms after the first for a 20-31 ms transfer): with the links twice as fast that lag
    # shrinks, no further than by half; its reduce-scatters, gloo all-reduces alone on the links, keep theirs
    run = tracekit.open(str(SAMPLES / "layouts" / "fsdp_2hosts_100mbit"), store=str(tmp_path / "s"))
    g, late, same, _ = _late_lags(run, 1.0)
    assert (same[late] == g.lag_ns[late]).all()
    _, _, faster, _ = _late_lags(run, 2.0)
    op = _op_of(g)
    gather, reduce = late & (op == "all_gather"), late & (op == "all_reduce")
    assert gather.sum() >= 4 and reduce.sum() >= 2
    assert (faster[gather] < g.lag_ns[gather]).all() and (faster[gather] >= g.lag_ns[gather] // 2).all()
    assert (faster[reduce] == g.lag_ns[reduce]).all()


def _as_recorded_now(tmp_path, name):
    """A 400 Mbit/s layout sample whose run.json says what the testbed's now does (its samples predate it): the
    links' token bucket (the rule's 25000 bytes at that rate), their frames and the hosts' round trip."""
    path = tmp_path / name
    shutil.copytree(SAMPLES / "layouts" / name, path)
    doc = json.loads((path / "run.json").read_text())
    doc["testbed"].update(frames="jumbo", mtu=9000, rtt_us=25.0)
    for link in doc["testbed"]["links"]:
        link["burst_bytes"] = 25000
    (path / "run.json").write_text(json.dumps(doc))
    return tracekit.open(str(path), store=str(tmp_path / f"{name}.store"))


def test_one_size_transfers_take_the_links_nominal_rate_and_the_rest_as_latency_the_link_can_have(tmp_path):
    # a pipeline's 64 KiB sends, one size, time a slower link with no latency as well as the shaped one with some:
    # told the links' rate (run.json's tc rate), the fit takes it, as payload (9000-byte frames less their TCP/IP
    # headers, over the frame the shaper counts), and the rest of the typical send as latency
    from analyses import depgraph
    from replay.model_steps import apply_models, payload_share

    assert payload_share({"mtu": 9000}) == pytest.approx(8948 / 9014) and payload_share({}) == pytest.approx(1448 / 1514)
    run = _as_recorded_now(tmp_path, "pp_1f1b_2hosts_400mbit")
    bound_ns = 25e3 + 9014 / 0.05  # the round trip and one frame at 400 Mbit/s
    _, _, notes, info = apply_models(depgraph.build(run), scenario_from_dict({"network": {}}, "x"), run)
    notes = " ".join(notes)
    assert "taken at its nominal 397.1 Mbit/s of payload" in notes and "failed to identify" not in notes
    prm = info.links.params
    assert prm.capacity[links.INTER] == pytest.approx(0.05 * 8948 / 9014)
    assert 0 < prm.latency_ns[links.INTER] <= bound_ns and prm.overhead_ns.get(links.INTER, 0.0) == 0.0
    # NICs said to be sold at twice the rate: the sends would need more latency than the link can have, so that
    # rate is not the link's, the fit keeps its own capacity and says it failed to identify the NICs
    told = replay.run(run, scenario_from_dict({"network": {"nic_bandwidth_gbps": 0.1}}, "x"))
    notes = " ".join(told.notes)
    assert "of payload" not in notes and "failed to identify the hosts' NICs" in notes


def test_a_slower_links_bucket_hides_more_of_a_lone_transfers_tail_and_a_faster_ones_keeps_it(tmp_path):
    from replay.model_steps import apply_models

    # a stall of a transfer's sender costs only what it lasts beyond its link's token bucket filling (the bucket
    # then lets what it holds go at once): TP's 256 KiB all-reduces had tails of a mean 0.62 ms at 400 Mbit/s
    # behind the testbed's 0.5 ms bucket, 0.14 ms at 50 Mbit/s behind its 2.9 ms one. The TP sample, told the
    # testbed's bucket (its run.json predates the recorded depth): at 50 Mbit/s each tail loses the fill times'
    # difference; at 800 it is kept as measured (the stalls the run's bucket hid are unseen)
    assert linkfit.tail_at(3_000_000, 500_000, 2_880_000) == 620_000
    assert linkfit.tail_at(1_000_000, 500_000, 2_880_000) == 0
    assert linkfit.tail_at(1_000_000, 2_880_000, 500_000) == linkfit.tail_at(1_000_000, 500_000, 500_000) == 1_000_000
    run = _as_recorded_now(tmp_path, "tp_2hosts_400mbit")
    g, late, same, tails = _late_lags(run, 1.0)
    late &= _op_of(g) == "all_reduce"
    assert late.sum() >= 4 and (same[late] == g.lag_ns[late]).all()
    for scale in (0.125, 2.0):
        _, lag, _, info = apply_models(g, scenario_from_dict({"network": {"bandwidth_scale": scale}}, "s.toml"), run)
        run_cap = info.links.params.capacity[links.INTER]
        fill_run, fill = 25000 / run_cap, info.links.burst_at(scale) / (run_cap * scale)
        assert fill > fill_run if scale < 1 else fill <= fill_run
        kept = np.array([linkfit.tail_at(int(t), fill_run, fill) for t in tails])
        assert (lag[late] == g.lag_ns[late] + kept[late]).all()
        if scale < 1:
            assert (kept[late] < tails[late]).any() and (kept <= tails).all()
        else:
            assert (kept == tails).all()


def test_what_a_flow_can_still_have_on_its_links_after_the_first_rank_is_done():
    from replay.model_steps import on_links_after_first_ns

    alike, unlike = np.array([2.0, 2.0, 2.0, 2.0]), np.array([2.0, 2.0, 8.0, 8.0])
    # a 4-rank ring all-reduce alone on its links moves 6 steps of 1000 bytes on each link
    assert on_links_after_first_ns("all_reduce", 6000.0, 6.0, alike, shared=False) == 0.0
    assert on_links_after_first_ns("all_reduce", 6000.0, 6.0, unlike, shared=False) == 1000 / 2 - 1000 / 8
    # one that shared its links, a gather, a broadcast or a send: all of its bytes at its slowest link
    assert on_links_after_first_ns("all_reduce", 6000.0, 6.0, alike, shared=True) == 3000.0
    for op in ("all_gather", "reduce_scatter", "broadcast", "send"):
        assert on_links_after_first_ns(op, 6000.0, 3.0, unlike, shared=False) == 3000.0


def test_overlapped_flows_are_the_ones_that_shared_a_link_in_the_run(runs):
    import pandas as pd

    colls = pd.DataFrame({"op": ["all_reduce"] * 4, "bytes": [1000, 1000, 1000, 1000], "group_size": [2] * 4,
                          "ranks": [[0, 1], [0, 1], [0, 1], [2, 3]]})
    lf = links.build(colls, {0: 0, 1: 1, 2: 2, 3: 3})
    # 0 and 1 overlap on hosts 0/1's NICs; 2 starts after both ended; 3 overlaps 2 in time on other hosts' NICs
    start = np.array([0, 50, 300, 310])
    end = np.array([100, 200, 400, 410])
    assert links.overlapped(lf, start, end).tolist() == [True, True, False, False]
    # windows too far apart for one shifted int64 axis (a clock jump): the same answer
    far = 2 ** 61
    assert links.overlapped(lf, start + np.array([0, 0, 0, far]), end + np.array([0, 0, 0, far])).tolist() == [
        True, True, False, False]
    # a run of one collective at a time: an alpha-beta what-if has no overlap note; the note is for runs whose
    # collectives shared a link (DDP buckets on gloo's threads), where that model over-counts the link
    res = replay.run(runs["ddp2_2hosts_100mbit"], scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "x"))
    assert not any("shared a link" in n for n in res.notes)


def test_a_fitted_latency_above_the_links_round_trip_is_split_into_the_link_and_software():
    # lone transfers of three sizes, 80 us per latency step (a ring's 2 steps) and 100 Mbit/s: the regression sees
    # 80 us; a link whose round trip and frame take 30 us cannot have more, the other 50 us are software
    rng = np.random.default_rng(1)
    sizes = rng.choice([100e3, 400e3, 1600e3], 30)
    colls = pd.DataFrame({"op": ["all_reduce"] * 30, "bytes": pd.array(sizes.astype(int), dtype="Int64"),
                          "group_size": [2] * 30, "ranks": [[0, 1]] * 30})
    lf = links.build(colls, {0: 0, 1: 1})
    truth = links.LinkParams({"intra_node": 10.0, "inter_node": 100 / 8e3}, {"intra_node": 0.0, "inter_node": 80e3})
    starts = np.arange(30, dtype=np.int64) * 400_000_000
    measured = linkfit.transfers(lf, starts, truth)
    ops = np.array(["all_reduce"] * 30, dtype=object)
    free = linkfit.fit(lf, starts, measured, ops)
    bound = linkfit.fit(lf, starts, measured, ops, latency_bound_ns={"inter_node": 30e3})
    assert free.params.latency_ns["inter_node"] == pytest.approx(80e3, rel=1e-3) and not free.params.overhead_ns
    assert bound.params.latency_ns["inter_node"] == 30e3
    assert bound.params.overhead_ns["inter_node"] == pytest.approx(50e3, rel=1e-3)
    assert any("software per step" in n for n in bound.notes)
    # the transfers take what they took: the split moves nothing, nor does a bound the fit is under
    assert (linkfit.transfers(lf, starts, bound.params) == linkfit.transfers(lf, starts, free.params)).all()
    assert linkfit.fit(lf, starts, measured, ops, latency_bound_ns={"inter_node": 90e3}).params.overhead_ns == {}
    # the link's latency scales, the software's does not: twice the latency is 30 us more a step, not 80
    twice_free, twice_bound = free.params.scaled(latency=2.0), bound.params.scaled(latency=2.0)
    assert twice_free.step_ns("inter_node") == pytest.approx(160e3, rel=1e-3)
    assert twice_bound.step_ns("inter_node") == pytest.approx(110e3, rel=1e-3)


def test_the_round_trip_bounds_the_fitted_latency_of_a_run_and_leaves_bandwidth_what_ifs_alone(runs, tmp_path):
    run = runs["ddp2_2hosts_100mbit"]

    def step(net):
        res = replay.run(run, scenario_from_dict({"network": {"model": "links", **net}}, "x"))
        return res, int(res.summary().predicted_step_ns.max())

    # the fit takes ~210 us a latency step; told of a 1 us round trip and 10 GB/s NICs (this run.json names no MTU:
    # a 1514-byte frame, 0.15 us), the link keeps 1.15 us of it and the rest is software: a bandwidth what-if is the
    # same to the ns
    free, free_ns = step({"bandwidth_scale": 2.0})
    told, told_ns = step({"bandwidth_scale": 2.0, "rtt_us": 1.0, "nic_bandwidth_gbps": 10.0})
    assert free.info.links.params.latency_ns["inter_node"] > 100e3
    fit = told.info.links
    assert "mtu" not in run.run_manifest()["testbed"]
    assert fit.params.latency_ns["inter_node"] == pytest.approx(1e3 + 1514 / 10.0)
    assert fit.params.step_ns("inter_node") == pytest.approx(free.info.links.params.step_ns("inter_node"))
    assert told_ns == free_ns
    assert any("us of software" in n for n in told.notes)

    # run.json's round trip, where the testbed measured it, is the bound when the scenario gives none: the same run
    # with one recorded (its 100 Mbit/s and a 1514-byte frame: 121 us, and 1 us)
    assert "rtt_us" not in run.run_manifest()["testbed"]  # recorded before the testbed measured it
    copy = tmp_path / "with_rtt"
    shutil.copytree(SAMPLES / "ddp2_2hosts_100mbit", copy, ignore=shutil.ignore_patterns(".tracekit"))
    manifest = json.loads((copy / "run.json").read_text())
    manifest["testbed"]["rtt_us"] = 1.0
    (copy / "run.json").write_text(json.dumps(manifest))
    with tracekit.open(str(copy)) as measured:
        res = replay.run(measured, scenario_from_dict({"network": {"model": "links", "bandwidth_scale": 2.0}}, "x"))
    assert res.info.links.params.latency_ns["inter_node"] == pytest.approx(1e3 + 1514 / (100 / 8e3))
    assert int(res.summary().predicted_step_ns.max()) == free_ns


def test_a_lone_transfer_of_one_frame_keeps_no_factor_above_one_and_the_rest_is_its_tail():
    # 512-byte all-reduces alone on a 100 Mbit/s link that took 0.3-4.7 ms each (a thread waking on a scheduler
    # tick), most of the all-reduces, beside 256 KB ones that took their bytes' time: a faster link shortens the
    # big ones, not the small ones' wait
    n = 24
    sizes = np.where(np.arange(n) % 4 == 0, 262144, 512)
    colls = pd.DataFrame({"op": ["all_reduce"] * n, "bytes": pd.array(sizes, dtype="Int64"), "group_size": [2] * n,
                          "ranks": [[0, 1]] * n})
    lf = links.build(colls, {0: 0, 1: 1})
    prm = links.LinkParams({"intra_node": 10.0, "inter_node": 100 / 8e3}, {"intra_node": 0.0, "inter_node": 0.0})
    starts = np.arange(n, dtype=np.int64) * 100_000_000
    small = sizes == 512
    measured = np.where(small, np.linspace(300_000, 4_700_000, n), np.rint(sizes / prm.capacity["inter_node"]))
    measured = measured.astype(np.int64)
    groups, alone = np.zeros(n, np.int64), np.ones(n, bool)
    k0, tail0, share0 = linkfit._factors(lf, starts, measured, prm, groups, alone)  # no frame: all bandwidth
    k1, tail1, share1 = linkfit._factors(lf, starts, measured, prm, groups, alone, frame_bytes=1500)
    assert np.median(k0[small]) > 10 and (tail0[small] < measured[small] / 2).any()
    assert (k1[small] <= 1.0).all() and (tail1[small] >= measured[small] - 50_000).all()
    assert np.allclose(k1[~small], k0[~small]) and (tail1[~small] == tail0[~small]).all()
    # unchanged, every transfer takes what it took either way
    for k, tail, share in ((k0, tail0, share0), (k1, tail1, share1)):
        took = linkfit.transfers(lf, starts, prm, k, share) + tail
        assert np.abs(took - measured).max() <= 2
    # twice the rate: the big ones halve, the small ones keep their wait
    fast = prm.scaled(bandwidth=2.0)
    took = linkfit.transfers(lf, starts, fast, k1, share1) + tail1
    assert np.allclose(took[~small], measured[~small] / 2, rtol=1e-3)
    assert (took[small] >= measured[small] - 50_000).all()


def test_a_few_lone_transfers_give_way_to_the_busy_periods_that_deny_them(runs, tmp_path):
    # DP x PP's pipeline sends between a host's two ranks (loopback): the lone ones fit a line under which the busy
    # periods of all its transfers end several times their length off the measured ones; the busy periods' own fit
    # is taken. The DDP sample's lone all-reduces agree with its busy periods, and stand
    import re

    from analyses import depgraph

    run = tracekit.open(str(SAMPLES / "layouts" / "dp_pp_2hosts_100mbit"), store=str(tmp_path / "dp_pp"))
    res = replay.run(run, scenario_from_dict({"network": {"model": "links"}}, "x"))
    lf, fit, _ = res.info.links_fit
    assert fit.source["intra_node"].startswith("busy periods")
    note = next(n for n in res.notes if "lone transfer(s) fitted" in n)
    mbit, us, was, now = (float(x) for x in re.search(
        r"fitted ([\d.]+) Mbit/s and ([\d.]+) us per step, which leave its busy periods (\d+)% rms off the measured "
        r"ones; their own fit, (\d+)%", note).groups())
    g = depgraph.build(run)
    periods = linkfit._Periods(lf, g.colls.barrier_start_ns.to_numpy(np.int64)[lf.coll_row],
                               g.colls.measured_transfer_ns.to_numpy(np.int64)[lf.coll_row])
    lone = links.LinkParams({**fit.params.capacity, "intra_node": mbit / 8e3},
                            {**fit.params.latency_ns, "intra_node": us * 1e3}, burst=dict(fit.params.burst))
    off = periods.loss("intra_node", lone) ** 0.5
    assert 100 * off == pytest.approx(was, abs=1.0) and was > 100
    assert 100 * periods.loss("intra_node", fit.params) ** 0.5 == pytest.approx(now, abs=1.0)
    assert now ** 2 < linkfit.LONE_FIT_GAIN * was ** 2
    ddp = replay.run(runs["ddp2_2hosts_100mbit"], scenario_from_dict({"network": {"model": "links"}}, "x"))
    assert "lone transfer(s)" in ddp.info.links.source["inter_node"]
    assert not any("lone transfer(s) fitted" in n for n in ddp.notes)
