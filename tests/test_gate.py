"""The regression gate: statistics against hand-worked values, the CLI on real sample runs (noise
only must pass, a real slowdown must fail), prediction mode, config errors and the CI outputs."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.gate import compare
from tracekit.gate.config import GateConfig, load_config
from tracekit.gate.stats import mann_whitney, smallest_p_value

from .conftest import tiny_events, write_trace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


# --- statistics -------------------------------------------------------------------------------

def test_mann_whitney_hand_worked():
    # complete separation, 6 vs 6: U = 36, mean 18, var = 6*6*13/12 = 39,
    # z = (18 - 0.5) / sqrt(39) = 2.8022, p = erfc(z / sqrt 2) = 0.005075
    r = mann_whitney([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    assert r.u_candidate == 36 and r.rank_biserial == 1.0
    assert r.z == pytest.approx(17.5 / 39 ** 0.5)
    assert r.p_value == pytest.approx(0.0050749, rel=1e-4)
    # ties: [1, 2, 2] vs [2, 3, 3]; ranks 1, 3, 3 | 3, 5.5, 5.5 -> U_y = 14 - 6 = 8;
    # tie groups 3 and 2: var = 9/12 * (7 - (24 + 6) / 30) = 4.5; z = (8 - 4.5 - 0.5) / sqrt(4.5)
    r = mann_whitney([1, 2, 2], [2, 3, 3])
    assert r.u_candidate == 8
    assert r.z == pytest.approx(3 / 4.5 ** 0.5)
    # all equal: no evidence at all
    assert mann_whitney([5, 5, 5], [5, 5]).p_value == 1.0


def test_mann_whitney_matches_scipy_when_present():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    for _ in range(20):
        a, b = rng.integers(0, 6, rng.integers(3, 12)), rng.integers(1, 8, rng.integers(3, 12))
        ref = stats.mannwhitneyu(b, a, method="asymptotic", use_continuity=True)
        r = mann_whitney(a, b)
        assert r.u_candidate == ref.statistic and r.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


def test_smallest_p_value():
    assert smallest_p_value(3, 3) > 0.05      # 3 vs 3 can never be significant at 0.05
    assert smallest_p_value(6, 6) < 0.01


# --- real runs --------------------------------------------------------------------------------

def _split(tmp: Path, name: str, ranks) -> Path:
    """A subset of ddp4_loopback's ranks as its own run: even and odd ranks of one job are two
    samples of the same job's noise (same code, same machine, same steps)."""
    d = tmp / name
    d.mkdir()
    for r in ranks:
        for f in SAMPLES.joinpath("ddp4_loopback").glob(f"rank{r}.*"):
            shutil.copy(f, d / f.name)
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Stores of the runs the tests compare, ingested once."""
    tmp = tmp_path_factory.mktemp("gate")
    out = {"even": _split(tmp, "even", (0, 2)), "odd": _split(tmp, "odd", (1, 3))}
    for name in ("ddp2_2hosts_100mbit", "ddp2_2hosts_400mbit"):
        out[name] = SAMPLES / name
    stores = {}
    for name, d in out.items():
        stores[name] = str(tmp / f"{name}.store")
        tracekit.open(d, stores[name]).close()
    return stores


def _gate(*args):
    r = CliRunner().invoke(cli, ["gate", *map(str, args)])
    return r


def _metrics(path) -> dict:
    return {m["metric"]: m for m in json.loads(Path(path).read_text())["metrics"]}


@pytest.mark.slow  # ingests six recorded runs
def test_same_job_noise_passes(runs, tmp_path):
    for base, cand in (("even", "odd"), ("odd", "even")):
        js = tmp_path / f"{base}.json"
        r = _gate(runs[base], runs[cand], "--json", js)
        assert r.exit_code == 0, r.output
        m = _metrics(js)
        # the pass is the test's verdict, not a lack of data: step time was tested on 6 vs 6 steps
        assert m["step_time_ns"]["p_value"] is not None and m["step_time_ns"]["n_baseline"] == 6
        assert {"exposed_comm_ns", "compute_ns", "idle_pct"} <= set(m)
        assert all(x["status"] != "fail" for x in m.values())
    # a noisy metric over its threshold is let through because the test finds no significance
    assert m["exposed_comm_ns"]["change_pct"] > 10 and m["exposed_comm_ns"]["p_value"] > 0.05


@pytest.mark.slow  # ingests six recorded runs
def test_slow_link_fails(runs, tmp_path):
    js, md, xml = tmp_path / "g.json", tmp_path / "g.md", tmp_path / "g.xml"
    r = _gate(runs["ddp2_2hosts_400mbit"], runs["ddp2_2hosts_100mbit"], "--json", js, "--markdown", md, "--junit", xml)
    assert r.exit_code == 1, r.output
    assert "gate: REGRESSION" in r.output
    m = _metrics(js)
    assert m["step_time_ns"]["status"] == "fail" and m["step_time_ns"]["change_pct"] > 20
    assert m["step_time_ns"]["p_value"] < 0.01 and m["step_time_ns"]["effect_size"] == 1.0
    assert m["exposed_comm_ns"]["status"] == "fail"
    # the link is what got slower: busbw dropped 4x, significant over 6 all-reduces per run
    assert m["busbw_gbps:all_reduce"]["status"] == "fail" and m["busbw_gbps:all_reduce"]["change_pct"] < -50
    assert "### tracekit gate: REGRESSION" in md.read_text() and "| ❌ | `step_time_ns`" in md.read_text()
    suite = ET.parse(xml).getroot()
    assert int(suite.get("tests")) == len(m) and int(suite.get("failures")) == 3
    assert {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None} == \
        {"step_time_ns", "exposed_comm_ns", "busbw_gbps:all_reduce"}
    # the other way round, step time, exposed communication and busbw improve significantly; CPU
    # compute time per step moves by more than its threshold but within noise, and the gate says so
    r = _gate(runs["ddp2_2hosts_100mbit"], runs["ddp2_2hosts_400mbit"], "--json", js)
    m = _metrics(js)
    assert m["step_time_ns"]["note"] == m["exposed_comm_ns"]["note"] == "significant improvement"
    assert m["busbw_gbps:all_reduce"]["note"] == "significant improvement"
    assert r.exit_code == 0 and not [k for k, v in m.items() if v["status"] == "fail"]


@pytest.mark.slow  # ingests six recorded runs
def test_thresholds_from_config_decide(runs, tmp_path, monkeypatch):
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text('[tool.tracekit.gate]\nalpha = 0.01\n[tool.tracekit.gate.thresholds]\n'
                   'step_time_ns = "250%"\nexposed_comm_ns = "350%"\n"busbw_gbps:all_reduce" = "80%"\n')
    monkeypatch.chdir(tmp_path)  # found as ./pyproject.toml without --config
    js = tmp_path / "g.json"
    r = _gate(runs["ddp2_2hosts_400mbit"], runs["ddp2_2hosts_100mbit"], "--json", js)
    assert r.exit_code == 0, r.output
    assert "over threshold" not in _metrics(js)["step_time_ns"]["note"]
    # an absolute threshold in the metric's unit: 10 ms of step time
    (tmp_path / "g.toml").write_text('[thresholds]\nstep_time_ns = 10000000\n')
    r = _gate(runs["ddp2_2hosts_400mbit"], runs["ddp2_2hosts_100mbit"], "--config", tmp_path / "g.toml", "--json", js)
    assert r.exit_code == 1 and _metrics(js)["step_time_ns"]["threshold"] == "1e+07"


@pytest.mark.slow  # ingests six recorded runs
def test_prediction_error_counts_both_ways(runs, tmp_path):
    # a replay is stored like a measured run; two measured stores stand in for measured/predicted.
    # A step-time model's error budget: only step_time_ns, within 10%.
    cfg = tmp_path / "budget.toml"
    cfg.write_text('metrics = ["step_time_ns"]\n[thresholds]\nstep_time_ns = "10%"\n')
    fast, slow = runs["ddp2_2hosts_400mbit"], runs["ddp2_2hosts_100mbit"]
    assert _gate(slow, fast, "--config", cfg).exit_code == 0             # faster: no regression
    r = _gate(slow, fast, "--config", cfg, "--prediction")                # but a 20% under-prediction
    assert r.exit_code == 1 and "OVER ERROR BUDGET" in r.output
    assert _gate(fast, slow, "--config", cfg, "--prediction").exit_code == 1
    assert _gate(fast, fast, "--config", cfg, "--prediction").exit_code == 0


def test_single_value_and_kernel_metrics(tmp_path):
    a = tmp_path / "a"
    write_trace(a / "rank0.trace.json", tiny_events(n_steps=4), rank=0, world_size=1)
    b = tmp_path / "b"
    write_trace(b / "rank0.trace.json", tiny_events(n_steps=4, t0_us=5000.0), rank=0, world_size=1)
    res = compare(tracekit.open(a, str(tmp_path / "sa")), tracekit.open(b, str(tmp_path / "sb")), GateConfig())
    m = {x.metric: x for x in res.metrics}
    assert m["peak_memory_bytes"].note == "single value: threshold only" and m["peak_memory_bytes"].status == "pass"
    assert m["kernel_time_ns:gemm_kernel"].n_baseline == 4 and res.passed


@pytest.mark.slow  # ingests six recorded runs
def test_bad_config_is_one_line_exit_2(runs, tmp_path):
    bad = tmp_path / "gate.toml"
    for text, expect in (("alpah = 0.1\n", "unknown key 'alpah'; allowed keys: alpha"),
                         ("[thresholds]\nstep_time_ns = \"fast\"\n", "thresholds.step_time_ns = 'fast'"),
                         ("[thresholds]\nstep_ns = \"5%\"\n", "thresholds.step_ns: unknown metric; allowed: step_time_ns"),
                         ("metrics = [\"gpu\"]\n", "metrics has 'gpu'; allowed values: step_time_ns"),
                         ("alpha = 2\n", "alpha = 2"),
                         ("alpha = \n", "not valid TOML")):
        bad.write_text(text)
        r = _gate(runs["even"], runs["odd"], "--config", bad)
        assert r.exit_code == 2, (text, r.output)
        err = r.stderr if hasattr(r, "stderr") else r.output
        assert err.count("\n") == 1 and str(bad) in err and expect in err, err
    r = _gate(tmp_path / "nope", runs["odd"])
    assert r.exit_code == 2 and "BASELINE" in r.output and "nope" in r.output
    r = _gate(runs["even"], runs["odd"], "--junit", tmp_path / "no" / "dir" / "x.xml")
    assert r.exit_code == 2 and "--junit" in r.output


def test_load_config_defaults_without_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    cfg = load_config(cwd=str(tmp_path))
    assert cfg.source == "defaults" and str(cfg.threshold("busbw_gbps:all_reduce")) == "10%"


def test_markdown_and_junit_in_human_units_json_raw():
    from tracekit.gate import GateResult, MetricResult
    from tracekit.gate import render

    def metric(name, unit, b, c, threshold):
        return MetricResult(metric=name, unit=unit, better="lower", status="pass", baseline_median=b,
                            candidate_median=c, change_pct=None, threshold=threshold, n_baseline=6, n_candidate=6,
                            p_value=None, effect_size=float("nan"), note="")

    result = GateResult([metric("step_time_ns", "ns", 89478383.0, 95000000.0, "1e+07"),
                         metric("busbw_gbps:all_reduce", "GB/s", 12.3, 0.0519, "10%"),
                         metric("peak_memory_bytes", "bytes", float(3 << 30), None, "5%")],
                        "regression", 0.05, "defaults")
    md = render.markdown(result, "base/", "cand/")
    assert "| `step_time_ns` | 89.5 ms | 95 ms | " in md and "| 10 ms |" in md
    assert "| 12.3 GB/s | 51.9 MB/s |" in md and "| 3.0 GiB |  |" in md
    assert "baseline median 89.5 ms, candidate 95 ms, threshold 10 ms" in render.junit(result)
    # the terminal table shows values in human units under names without the raw unit; Markdown and JUnit
    # name each metric as a config's thresholds do
    assert [r["metric"] for r in render.summary_rows(result)] == ["step_time", "busbw:all_reduce", "peak_memory"]
    assert "| `busbw_gbps:all_reduce` | 12.3 GB/s |" in md and 'name="busbw_gbps:all_reduce"' in render.junit(result)
    doc = json.loads(render.to_json(result))
    assert doc["metrics"][0]["baseline_median"] == 89478383.0 and doc["metrics"][0]["effect_size"] is None
