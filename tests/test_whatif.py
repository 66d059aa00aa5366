"""What-if scenarios end to end: validated against the bundled testbed runs, and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import replay
import analyses.depgraph
import tracekit
from replay.scenario import scenario_from_dict
from replay.whatif import whatif
from tracekit.cli import cli

from .conftest import REPO

SAMPLES = REPO / "sample_traces"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("whatif")
    names = ("ddp2_2hosts_100mbit", "ddp2_2hosts_400mbit", "ddp4_4hosts_100mbit", "ddp3_slow_rank1")
    return {n: tracekit.open(SAMPLES / n, store=str(base / n)) for n in names}


def _job_step(result, col="predicted_step_ns"):
    return result.summary()[col].max()


_CASES = [
    ("ddp2_2hosts_100mbit", {"network": {"bandwidth_scale": 4.0}}, "ddp2_2hosts_400mbit", 5.0),
    ("ddp2_2hosts_400mbit", {"network": {"bandwidth_scale": 0.25}}, "ddp2_2hosts_100mbit", 5.0),
    ("ddp2_2hosts_100mbit", {"parallelism": {"dp": 4}}, "ddp4_4hosts_100mbit", 10.0),
    ("ddp4_4hosts_100mbit", {"parallelism": {"dp": 2}}, "ddp2_2hosts_100mbit", 10.0),
]
_FOUR_TO_TWO_LINKS = pytest.mark.xfail(strict=True, reason=(
    "links model +10.1% (alpha-beta +9.4%, the links model before 2026-12-04 +10.0%): the 4-host run's 4 processes "
    "shared 2 cores, and its stretched compute stays in a 2-rank prediction (docs/whatif.md)"))


_FOUR_HUNDRED_TO_HUNDRED_LINKS = pytest.mark.xfail(strict=True, reason=(
    "links model -5.6% (alpha-beta within 5%; -1.1% before 2026-12-05): the 400 Mbit/s run's DDP buckets moved at "
    "4% over the link's rate and the 100 Mbit/s run's at 3% under it, which scaling one by 4 cannot give; the -1.1% "
    "had come from the 400 Mbit/s run's 4-byte start-up broadcast, 2.1 ms of waiting (0.2 ms at 100 Mbit/s) taken as "
    "bandwidth and made 4x as long, which a lone transfer of one frame no longer is (replay/linkfit.py _factors)"))


def _marks(case, model):
    if model != "links":
        return []
    if case[1].get("parallelism") == {"dp": 2}:
        return [_FOUR_TO_TWO_LINKS]
    if case[0] == "ddp2_2hosts_400mbit" and case[2] == "ddp2_2hosts_100mbit":
        return [_FOUR_HUNDRED_TO_HUNDRED_LINKS]
    return []


@pytest.mark.slow  # replays recorded runs under what-ifs
@pytest.mark.parametrize("src, doc, dst, target_pct, model", [
    pytest.param(*case, model, marks=_marks(case, model)) for case in _CASES for model in ("alpha_beta", "links")])
def test_prediction_matches_the_run_recorded_under_those_conditions(runs, src, doc, dst, target_pct, model):
    doc = {**doc, "network": {**doc.get("network", {}), "model": model}}
    predicted = _job_step(replay.run(runs[src], scenario_from_dict(doc, "s")))
    measured = _job_step(replay.run(runs[dst]), "measured_step_ns")
    assert abs(predicted - measured) / measured * 100 <= target_pct, (predicted, measured)
    # and it is a prediction: far from the run it started from
    assert abs(predicted - _job_step(replay.run(runs[src]), "measured_step_ns")) / measured > 0.25


def test_identity_and_zero_delay_optical_give_the_baseline_exactly(runs):
    run = runs["ddp2_2hosts_100mbit"]
    base = replay.run(run)
    for doc in ({}, {"network": {"bandwidth_scale": 1.0}},
                {"optical": {"reconfig_delay_ms": 0.0, "schedule": "phase",
                             "phase": [{"match": "broadcast", "name": "a"}, {"match": "all_reduce", "name": "b"}]}}):
        r = replay.run(run, scenario_from_dict(doc, "same"))
        assert np.array_equal(r.start_ns, base.start_ns), doc


def test_more_optical_reconfigurations_never_make_a_step_faster(runs):
    run = runs["ddp2_2hosts_100mbit"]
    phases = {"job": [],
              "two": [{"match": "broadcast", "name": "a"}, {"match": "all_reduce", "name": "b"}],
              "per_step": [{"match": "*", "ordinals": [k, k + 1], "name": f"s{k}"} for k in range(8)]}
    prev = None
    for key in ("job", "two", "per_step"):
        doc = {"optical": {"reconfig_delay_ms": 5.0, "schedule": "phase" if phases[key] else "job"}}
        if phases[key]:
            doc["optical"]["phase"] = phases[key]
        r = replay.run(run, scenario_from_dict(doc, key))
        end = r.steps.predicted_end_ns.max()
        n = r.info.reconfigurations or 0
        if prev is not None:
            assert n >= prev[1] and end >= prev[0]
        prev = (end, n)
    assert prev[1] >= 7  # one per collective after the first


def test_circuits_at_the_nics_rate_are_the_run_and_at_n_times_are_links_n_times(runs):
    # the testbed's NICs were shaped to 100 Mbit/s (run.json): circuits at that rate are the link the run had,
    # with the efficiency and the sharing it had; at 4x they are the NICs 4x faster
    run = runs["ddp2_2hosts_100mbit"]
    base = replay.run(run)
    own = replay.run(run, scenario_from_dict({"optical": {"circuit_bandwidth_gbps": 0.0125, "reconfig_delay_ms": 0}},
                                             "own"))
    assert np.array_equal(own.start_ns, base.start_ns)
    assert any("efficiency the run's NICs reached" in n for n in own.notes)
    ocs = _job_step(replay.run(run, scenario_from_dict({"optical": {"circuit_bandwidth_gbps": 0.05,
                                                                    "reconfig_delay_ms": 0}}, "ocs4")))
    links4 = _job_step(replay.run(run, scenario_from_dict({"network": {"links": {"inter_node": {
        "bandwidth_scale": 4.0}}}}, "links4")))
    assert ocs == pytest.approx(links4, rel=1e-6) and links4 < 0.5 * _job_step(base)
    # the NICs' rate as the user gives it: circuits at that rate are the run again
    said = replay.run(run, scenario_from_dict({"network": {"nic_bandwidth_gbps": 0.025},
                                               "optical": {"circuit_bandwidth_gbps": 0.025, "reconfig_delay_ms": 0}},
                                              "said"))
    assert np.array_equal(said.start_ns, base.start_ns)


def test_a_reconfiguration_delays_the_transfers_after_it_by_its_delay_under_the_links_model(runs):
    run = runs["ddp2_2hosts_100mbit"]
    half = len(replay.run(run).graph.colls) // 2  # a collective inside the steps
    doc = {"optical": {"reconfig_delay_ms": 0.0, "phase": [{"match": "*", "ordinals": [0, half], "name": "a"},
                                                          {"match": "*", "ordinals": [half, 1_000_000], "name": "b"}]}}
    no_delay = replay.run(run, scenario_from_dict(doc, "d0"))
    doc["optical"]["reconfig_delay_ms"] = 50.0
    delayed = replay.run(run, scenario_from_dict(doc, "d50"))
    assert delayed.info.reconfigurations == 1
    # one 50 ms reconfiguration, before a collective of a step: that step ends later, by at most 50 ms
    grew = _job_step(delayed) - _job_step(no_delay)
    assert 0 < grew <= 50_000_000


def test_whatif_table_has_every_column_and_failures(runs, tmp_path):
    df = whatif(runs["ddp2_2hosts_100mbit"], [
        scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "links4x"),
        scenario_from_dict({"failures": {"strategy": "checkpoint_restart", "n_gpus": 16384,
                                         "target_steps": 100000}}, "llama3")], out_dir=str(tmp_path / "out"))
    assert df.scenario.tolist() == ["measured", "links4x", "llama3"]
    row = df.set_index("scenario").loc["links4x"]
    assert row.change_pct < -50 and row.exposed_comm_ns < row.measured_exposed_comm_ns
    fail = df.set_index("scenario").loc["llama3"]
    assert 80 < fail.effective_training_pct <= 100 and fail.time_to_train_h > 0
    # every re-timed run is a store every command reads
    out = tracekit.open(df.set_index("scenario").loc["links4x", "out"])
    assert out.store.manifest.label["kind"] == "replay"
    assert out.analyze("temporal_breakdown") is not None


def test_cli_whatif_simplest_file_as_written(tmp_path):
    s = tmp_path / "s.toml"
    s.write_text("[network]\nbandwidth_scale = 4.0\n")
    res = CliRunner().invoke(cli, ["whatif", str(SAMPLES / "ddp2_2hosts_100mbit"), str(s), "--store",
                                   str(tmp_path / "st"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # notes go to stderr
    assert len(doc) == 1 and doc[0]["scenario"] == "s"
    assert {"scenario", "measured_step_ns", "predicted_step_ns", "change_pct"} <= set(doc[0])
    assert doc[0]["change_pct"] < -50
    # the failure columns a scenario without [failures] leaves empty: kept in CSV and JSON, left out of the
    # table, whose other columns show human units under names without the raw unit
    empty = ["reconfigurations", "goodput_pct", "effective_training_pct", "time_to_train_h"]
    assert all(doc[0][c] is None for c in empty)
    res = CliRunner().invoke(cli, ["whatif", str(SAMPLES / "ddp2_2hosts_100mbit"), str(s), "--store",
                                   str(tmp_path / "st"), "--format", "csv"])
    assert res.stdout.splitlines()[0].split(",")[-4:] == empty
    res = CliRunner().invoke(cli, ["whatif", str(SAMPLES / "ddp2_2hosts_100mbit"), str(s), "--store",
                                   str(tmp_path / "st")])
    head = res.stdout.splitlines()[0].split()
    assert head[:3] == ["scenario", "measured_step", "predicted_step"] and not set(empty) & set(head)
    assert " ms " in res.stdout.splitlines()[2] + " "


@pytest.mark.parametrize("text, message", [
    ("[network]\nbandwith_scale = 4.0\n", "[network] bandwith_scale"),
    ("[network]\nbandwidth_scale = -1\n", "bandwidth_scale"),
    ("[parallelism]\ntp = 3\n", "[parallelism] tp x pp = 3 does not divide the run's 2 ranks"),
    ("[parallelism]\nschedule = \"zb\"\n", "[parallelism] schedule"),
    ("[parallelism]\ndp = 100000000\n", "[parallelism] dp: must be at most 1,048,576"),  # refused at load
    ("[network\n", "s.toml"),
])
def test_cli_whatif_bad_scenarios_fail_cleanly(tmp_path, text, message):
    s = tmp_path / "s.toml"
    s.write_text(text)
    res = CliRunner().invoke(cli, ["whatif", str(SAMPLES / "ddp2_2hosts_100mbit"), str(s), "--store",
                                   str(tmp_path / "st")])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("spec", ["nope", "dask://host:99999"])
def test_cli_whatif_bad_executor_fails_cleanly(tmp_path, spec):
    s = tmp_path / "s.toml"
    s.write_text("[network]\nbandwidth_scale = 2.0\n")
    res = CliRunner().invoke(cli, ["whatif", str(SAMPLES / "ddp2_2hosts_100mbit"), str(s), "--executor", spec,
                                   "--store", str(tmp_path / "st")])
    assert res.exit_code == 2, res.output
    assert f"--executor {spec!r}" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "st").exists()  # refused before any ingest


@pytest.mark.slow  # ~10 s: 16,384 ranks in each of the gradient collectives
def test_dp_16384_answers(runs):
    # far beyond the run, well inside replay/specs.py's MAX_DP: the collectives grow, the step with them
    run = runs["ddp4_4hosts_100mbit"]
    table = whatif(run, [scenario_from_dict({"parallelism": {"dp": 16384}}, "dp16384.toml")])
    row = table[table.scenario == "dp16384"].iloc[0]
    assert row.predicted_step_ns > 2 * row.measured_step_ns


def test_dp_change_takes_the_layout_from_distributed_info_without_run_json(runs, tmp_path):
    # a copy of the traces without run.json: distributedInfo (world size 2, one process group) gives the
    # data-parallel degree, and the what-if says where it came from. These testbed traces share one host name
    # (recorded before each testbed host had its own), so the hosts come from [topology], as a user would say it
    import gzip
    import json
    import shutil

    d = tmp_path / "norun"
    shutil.copytree(SAMPLES / "ddp2_2hosts_100mbit", d, ignore=shutil.ignore_patterns(".tracekit"))
    (d / "run.json").unlink()
    # the alpha-beta model: it costs each collective by the hosts [topology] says; the links model calibrates on
    # the hosts the run says it ran on (here one), and a placement the run never had has nothing fitted to it
    net = {"model": "alpha_beta"}
    sc = scenario_from_dict({"parallelism": {"dp": 4}, "topology": {"ranks_per_host": 1}, "network": net}, "x")
    res = replay.run(tracekit.open(d, store=str(tmp_path / "st")), sc)
    assert any("from the traces' distributedInfo" in n for n in res.notes)
    with_manifest = replay.run(runs["ddp2_2hosts_100mbit"], scenario_from_dict({"parallelism": {"dp": 4},
                                                                                "network": net}, "x"))
    assert res.summary().predicted_step_ns.max() == with_manifest.summary().predicted_step_ns.max()
    # without distributedInfo either, the degree is unknown, said so
    for f in d.glob("rank*.trace.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        doc.pop("distributedInfo")
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(tracekit.TracekitError, match="data-parallel degree is unknown"):
        replay.run(tracekit.open(d, store=str(tmp_path / "st2")), sc)


def test_slow_rank_what_if_removes_the_straggler(runs):
    # rank 1 sleeps 40 ms per step; making its CPU time (gaps included) 3x faster shortens every rank's step
    run = runs["ddp3_slow_rank1"]
    base = replay.run(run).summary()
    fast = replay.run(run, scenario_from_dict({"compute": {"rank_slowdown": {"1": 1 / 3}}}, "fix")).summary()
    assert (fast.predicted_step_ns < base.predicted_step_ns * 0.85).all()


@pytest.mark.parametrize("name", ["ddp2_2hosts_100mbit", "ddp2_2hosts_400mbit", "ddp4_4hosts_100mbit", "ddp3_slow_rank1"])
def test_calibrated_network_model_reproduces_the_baseline(runs, name):
    """Every transfer costed by the alpha-beta model fitted on the run (absolute mode, not the measured
    times): the mean step per rank within 2%. (The model gives each transfer's expected cost, not its
    noise, so single steps move by a few % either way; the median of 5 can too.)"""
    from replay.calibration import calibrate
    from replay.network import WhatIfComm
    from replay.scenario import Scenario

    class Calibrated(Scenario):
        def comm_model(self, colls, **kw):
            return WhatIfComm(calibrate(colls), mode="absolute")

    r = replay.run(runs[name], Calibrated(name="calibrated"))
    s = r.steps[~r.steps.is_last]
    m = s.groupby("rank")[["measured_step_ns", "predicted_step_ns"]].mean()
    err = (m.predicted_step_ns - m.measured_step_ns).abs() / m.measured_step_ns * 100
    assert (err <= 2.0).all(), err
    b = np.flatnonzero(r.graph.kind == analyses.depgraph.K["barrier"])
    assert not np.array_equal(r.end_ns[b] - r.start_ns[b], r.graph.dur_ns[b])  # the model's, not the measured
