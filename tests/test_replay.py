"""Replay engine and graph: the core on hand-made graphs, the invariants on real runs, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from click.testing import CliRunner

import replay
import tracekit
from analyses import depgraph as G
from replay.engine import Engine
from replay.replayer import apply_models, replay as replay_fn
from replay.scenario import Scenario
from replay.specs import NetworkSpec
from tracekit.cli import cli

from .conftest import REPO, shared_trace_dir


@pytest.fixture(scope="module")
def ddp3(tmp_path_factory):
    return tracekit.open(REPO / "sample_traces" / "ddp3_slow_rank1", store=str(tmp_path_factory.mktemp("s") / "st"))


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    d = shared_trace_dir("hta/critical_path/cuda_event_sync_multi_stream")
    return tracekit.open(d, store=str(tmp_path_factory.mktemp("g") / "st"))


# ---- the core on graphs small enough to check by hand

def test_engine_diamond_by_hand():
    # 0 origin -> 1 (dur 5) and 2 (dur 7); 3 waits for both ends, lag 2 after 2; 4 starts 1 after 1 starts
    src, dst = [0, 0, 1, 2, 1], [1, 2, 3, 3, 4]
    from_end = [True, True, True, True, False]
    lag = [0, 0, 0, 2, 1]
    e = Engine(5, src, dst, from_end, lag, source=0, t0_ns=100)
    s = e.run([0, 5, 7, 3, 4])
    assert s.start_ns.tolist() == [100, 100, 100, 109, 101]
    assert s.end_ns.tolist() == [100, 105, 107, 112, 105]
    assert s.events == 10


def test_engine_refuses_cycles_negative_lags_and_orphans():
    with pytest.raises(ValueError, match="exactly one node without dependencies"):
        Engine(3, [0], [1], [True], [0], source=0)  # node 2 has no dependency
    with pytest.raises(ValueError, match="negative"):
        Engine(2, [0], [1], [True], [-1], source=0)
    e = Engine(3, [0, 1, 2], [1, 2, 1], [True, True, True], [0, 0, 0], source=0)
    with pytest.raises(ValueError, match="cycle"):
        e.run([1, 1, 1])


def test_engine_until_stops_the_clock():
    e = Engine(4, [0, 1, 2], [1, 2, 3], [True] * 3, [0] * 3, source=0)
    s = e.run([0, 10, 10, 10], until=15)
    assert s.start_ns.tolist() == [0, 0, 10, -1]


def test_compiled_and_interpreted_cores_agree_bit_for_bit(ddp3):
    g = G.build(ddp3)
    a = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns, compiled=True).run(g.dur_ns)
    b = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns, compiled=False).run(g.dur_ns)
    assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)


def test_a_small_plain_replay_runs_interpreted_until_the_compiled_loop_is_loaded(monkeypatch):
    from replay import engine

    monkeypatch.setattr(engine, "_compiled", None)  # a fresh process: the compiled loop not loaded yet
    assert engine._core(None, 3_606, plain=True) is engine._interpreted  # a sample's baseline replay
    assert engine._core(False, 10**7, plain=False) is engine._interpreted
    if engine._njit is None:
        return
    big = engine._core(None, engine.INTERPRETED_MAX_NODES, plain=True)
    assert big is not engine._interpreted  # large graphs, flows and pools compile (linkfit runs thousands)
    assert engine._core(None, 10, plain=False) is big
    assert engine._core(None, 10, plain=True) is big  # once loaded, it runs everything



@pytest.mark.skipif(not hasattr(os, "getuid"), reason="the private cache folder is named by the user id")
def test_engine_caches_where_numba_finds_no_writable_folder(tmp_path, monkeypatch):
    # a read-only install for a user without a writable ~/.cache: numba's locators find no place for the cache and
    # numba refuses to compile; the engine caches in a folder of the user's own in the temp dir instead
    numba = pytest.importorskip("numba")
    from numba.core import caching

    from replay import engine

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [caching.UserProvidedCacheLocator])
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    src = tmp_path / "pkg" / "mod.py"
    src.parent.mkdir()
    src.write_text("def twice(x):\n    return 2 * x\n")
    ns: dict = {}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    with pytest.raises(RuntimeError, match="no locator available"):
        numba.njit(cache=True)(ns["twice"])
    assert engine._jit(ns["twice"])(21) == 42
    cache = tmp_path / f"tracekit-numba-{os.getuid()}"
    assert numba.config.CACHE_DIR == str(cache) and cache.stat().st_mode & 0o777 == 0o700
    assert list(cache.rglob("*twice*.nbi")) and list(cache.rglob("*twice*.nbc"))
    # no source file at all: nowhere to cache, compiled all the same
    exec(compile("def thrice(x):\n    return 3 * x\n", "<no file>", "exec"), ns)
    assert engine._jit(ns["thrice"])(2) == 6


# ---- the graph of real runs

def test_gloo_graph_has_collectives_barriers_and_host_waits(ddp3):
    g = G.build(ddp3)
    kinds = g.edges().kind.value_counts()
    # 3 ranks x 5 collectives (2 broadcasts + 3 all-reduces), one barrier each
    assert len(g.colls) == 5 and (g.kind == G.K["barrier"]).sum() == 5
    assert kinds["arrive"] == 15 and kinds["enqueue"] == 15
    assert kinds["host_wait"] >= 9  # each rank blocks after every all-reduce
    assert set(g.colls.op) == {"broadcast", "all_reduce"}
    # rank 1 sleeps 40 ms per step: the others wait in the all-reduces, so transfer << participants' time
    ar = g.colls[g.colls.op == "all_reduce"]
    skew = ar.last_arrival_ns - ar.first_arrival_ns
    assert (skew > 10_000_000).all() and skew.median() > 30_000_000
    assert (ar.measured_transfer_ns < skew).all()


def test_gpu_graph_links_launches_streams_and_syncs(gpu_run):
    g = G.build(gpu_run)
    kinds = g.edges().kind.value_counts()
    assert kinds["launch"] == (g.kind == G.K["gpu"]).sum()
    assert kinds["stream"] > 0 and kinds.get("sync", 0) + kinds.get("event_wait", 0) > 0
    assert g.stats["late_nodes"] == 0


# ---- invariants

def _check_dependencies(g, start, end, lag):
    released = np.where(g.from_end, end[g.src], start[g.src]) + lag
    assert (start[g.dst] >= released).all(), "a node started before one of its dependencies"


@pytest.mark.parametrize("which", ["ddp3", "gpu_run"])
def test_no_node_starts_before_its_dependencies(which, request):
    run = request.getfixturevalue(which)
    g = G.build(run)
    rng = np.random.default_rng(7)
    for dur in (g.dur_ns, (g.dur_ns * rng.uniform(0.2, 3.0, g.n_nodes)).astype(np.int64)):
        s = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns).run(dur)
        _check_dependencies(g, s.start_ns, s.end_ns, g.lag_ns)
        assert (s.end_ns - s.start_ns == dur).all()


def test_replay_is_bit_identical_across_runs(ddp3):
    a, b = replay_fn(ddp3), replay_fn(ddp3)
    assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
    assert a.event_times().equals(b.event_times())
    assert a.to_dict()["ranks"] == b.to_dict()["ranks"]


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("which", ["ddp3", "gpu_run"])
def test_scaling_every_duration_by_k_scales_the_step_by_k(which, k, request):
    run = request.getfixturevalue(which)
    g = G.build(run)
    e = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns)
    base = e.run(g.dur_ns)
    scaled = e.run(g.dur_ns * k, g.lag_ns * k)
    # every node (CPU time, gaps, GPU ops, transfers) k times longer: the whole schedule stretches by k
    assert np.array_equal(scaled.start_ns - g.origin_ns, k * (base.start_ns - g.origin_ns))
    r1 = replay_fn(run, graph=g)
    steps = _steps_of(g, scaled)
    assert np.allclose(steps, k * r1.steps.predicted_step_ns.to_numpy(), rtol=1e-6, atol=k)


def _steps_of(g, sched):
    from replay.replayer import ReplayResult, _steps
    import pandas as pd

    res = ReplayResult(graph=g, start_ns=sched.start_ns, end_ns=sched.end_ns, steps=pd.DataFrame(), run=None)
    return _steps(res).predicted_step_ns.to_numpy()


@pytest.mark.parametrize("which", ["ddp3", "gpu_run"])
def test_removing_idle_gaps_never_makes_a_step_end_later(which, request):
    run = request.getfixturevalue(which)
    g = G.build(run)
    e = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns)
    base = e.run(g.dur_ns)
    tight = e.run(g.dur_ns, np.zeros_like(g.lag_ns))
    assert (tight.start_ns <= base.start_ns).all() and (tight.end_ns <= base.end_ns).all()
    r = replay_fn(run, graph=g)
    from replay.replayer import ReplayResult, _steps
    import pandas as pd

    t = _steps(ReplayResult(graph=g, start_ns=tight.start_ns, end_ns=tight.end_ns, steps=pd.DataFrame(), run=None))
    assert (t.predicted_end_ns.to_numpy() <= r.steps.predicted_end_ns.to_numpy()).all()
    assert t.predicted_end_ns.max() < r.steps.predicted_end_ns.max()  # and there were gaps to remove


def test_faster_transfers_shorten_the_gloo_steps(ddp3):
    g = G.build(ddp3)
    base = replay_fn(ddp3, graph=g)

    class HalfComm:  # a communication model that halves every transfer
        notes = []

        def transfer_ns(self, colls, rng):
            return colls.measured_transfer_ns.to_numpy() // 2

    class Half(Scenario):  # a scenario with that model (a CommModel: the alpha-beta path's plug)
        def comm_model(self, calibrated_base=None, **kw):
            return HalfComm()

    half = Half(network=NetworkSpec(model="alpha_beta"))
    fast = replay_fn(ddp3, half, graph=g)
    b, f = base.summary(), fast.summary()
    assert (f.predicted_step_ns < b.predicted_step_ns).all()
    dur, _, _, _ = apply_models(g, half)
    bar = g.kind == G.K["barrier"]
    assert (dur[bar] == g.dur_ns[bar] // 2).all()


def test_subset_of_ranks_replays_with_missing_peers_stated(ddp3):
    r = replay.run(ddp3, ranks=[0, 2])
    d = r.to_dict()
    assert [x["rank"] for x in d["ranks"]] == [0, 2]
    assert any("peers outside the replayed ranks" in n for n in d["notes"])
    assert abs(d["error_pct"]) <= 2.0


# ---- CLI

def test_cli_replay_json_is_stable(tmp_path):
    res = CliRunner().invoke(cli, ["replay", str(REPO / "sample_traces" / "ddp3_slow_rank1"),
                                   "--store", str(tmp_path / "st"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # notes go to stderr
    assert {"rank", "measured_step_ns", "predicted_step_ns"} <= set(doc["ranks"][0])
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    assert isinstance(doc["error_pct"], float) and abs(doc["error_pct"]) <= 2.0


@pytest.mark.parametrize("args, message", [
    (["--ranks", "7"], "--ranks: rank(s) 7 not in the store"),
    (["--ranks", "a-b"], "--ranks 'a-b': expected rank numbers"),
])
def test_cli_replay_bad_options_fail_cleanly(tmp_path, args, message):
    res = CliRunner().invoke(cli, ["replay", str(REPO / "sample_traces" / "ddp3_slow_rank1"),
                                   "--store", str(tmp_path / "st"), *args])
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


@pytest.mark.slow  # writes, re-ingests and gates a replayed store
def test_cli_replay_out_writes_a_store_and_a_chrome_trace(tmp_path):
    import gzip

    out = tmp_path / "pred"
    scenario = tmp_path / "fast.toml"
    scenario.write_text("[network]\nbandwidth_scale = 2.0\n")
    res = CliRunner().invoke(cli, ["replay", str(REPO / "sample_traces" / "ddp3_slow_rank1"), "--store",
                                   str(tmp_path / "st"), "--scenario", str(scenario), "--out", str(out)])
    assert res.exit_code == 0, res.output
    pred = tracekit.open(out)
    assert pred.store.manifest.label["kind"] == "replay" and pred.store.manifest.label["scenario"] == "fast"
    # the predicted run reads like a measured one: steps are shorter than measured
    measured = tracekit.open(REPO / "sample_traces" / "ddp3_slow_rank1", store=str(tmp_path / "st"))
    q = "SELECT median(dur_ns) AS d FROM steps WHERE NOT is_last"
    assert pred.sql(q).d.iloc[0] < measured.sql(q).d.iloc[0]
    doc = json.loads(gzip.decompress((out / "replay.chrome.json.gz").read_bytes()))
    assert sum(1 for e in doc["traceEvents"] if e.get("ph") == "X") > 1000
    # and the gate compares measured against predicted
    r = CliRunner().invoke(cli, ["gate", str(REPO / "sample_traces" / "ddp3_slow_rank1"), str(out), "--baseline-store",
                                 str(tmp_path / "st")])
    assert r.exit_code in (0, 1) and "gate:" in r.output


@pytest.mark.slow  # four processes that import numba
def test_a_cached_loop_compiles_again_where_only_an_inlined_helper_changed(tmp_path):
    # numba keys a cache on its function's own file; engine._drop_stale adds the helpers' digest
    helper = tmp_path / "helper.py"
    helper.write_text("ONE = 1\n")
    (tmp_path / "loop.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import numba\n"
        "from replay.engine import _drop_stale\n"
        "def f(x):\n"
        "    return x + 1\n"
        "d = numba.njit(cache=True)(f)\n"
        f"_drop_stale(d, [{str(helper)!r}])\n"
        "d(1)\n"
        "print(sum(d.stats.cache_hits.values()))\n")

    def hits():
        out = subprocess.run([sys.executable, str(tmp_path / "loop.py")], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert hits() == 0  # compiled and cached
    assert hits() == 1  # loaded from the cache
    helper.write_text("ONE = 2\n")
    assert hits() == 0  # the helper changed, the loop's file did not: compiled again
    assert hits() == 1
