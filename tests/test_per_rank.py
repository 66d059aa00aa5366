"""Per-rank analyses in chunks (analyses/per_rank.py): a rank's rows never depend on which ranks share its chunk,
locally or on a real Dask cluster; a subset's views read only its ranks; --ranks / --sample-ranks say the sample."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

import tracekit
from analyses import per_rank
from analyses.registry import REGISTRY
from tracekit.cli import cli
from tracekit.errors import TracekitError

from .conftest import REPO, shared_trace_dir

SAMPLE = REPO / "sample_traces" / "ddp4_loopback"
TRACES_ONLY = shutil.ignore_patterns(".tracekit")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu") / "t"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    with tracekit.open(str(d)) as run:
        yield run


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    with tracekit.open(str(shared_trace_dir("hta/trace_filter")), store=str(tmp_path_factory.mktemp("gpu") / "s")) as run:
        yield run


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)


@pytest.mark.parametrize("name", sorted(per_rank.PER_RANK))
@pytest.mark.parametrize("which", ["cpu_run", "gpu_run"])
def test_one_rank_a_chunk_gives_the_whole_runs_rows(name, which, request):
    run = request.getfixturevalue(which)
    whole = REGISTRY[name].func(run)
    chunked = per_rank.run_per_rank(run, name, {}, chunk_ranks=1)
    _same(whole, chunked)


def test_by_step_rows_also_hold_per_chunk(cpu_run):
    _same(REGISTRY["temporal_breakdown"].func(cpu_run, by_step=True),
          per_rank.run_per_rank(cpu_run, "temporal_breakdown", {"by_step": True}, chunk_ranks=3))


def test_a_subset_sees_only_its_ranks(cpu_run):
    with cpu_run.subset([1, 3]) as sub:
        assert sub.ranks == [1, 3]
        assert sorted(sub.sql("SELECT DISTINCT rank FROM events")["rank"]) == [1, 3]
        assert sorted(sub.sql("SELECT DISTINCT rank FROM steps")["rank"]) == [1, 3]
    with pytest.raises(TracekitError, match="rank 7: not in this run"):
        cpu_run.subset([7])


def test_a_sample_is_said_in_the_note(cpu_run):
    df = per_rank.run_per_rank(cpu_run, "temporal_breakdown", {}, ranks=per_rank.sample_ranks(cpu_run.ranks, 2))
    assert list(df["rank"]) == [0, 2]
    assert df.attrs["note"].startswith("ranks: 2 of 4 (0, 2)")
    whole = REGISTRY["temporal_breakdown"].func(cpu_run)
    _same(whole[whole["rank"].isin([0, 2])], df)


def test_rank_specs():
    every = list(range(16))
    assert per_rank.parse_ranks("0-3,8, 10", every) == [0, 1, 2, 3, 8, 10]
    for bad, msg in [("3-1", "runs backwards"), ("a", "expected ranks"), ("20", "rank 20 is not in this run")]:
        with pytest.raises(TracekitError, match=msg):
            per_rank.parse_ranks(bad, every)
    assert per_rank.sample_ranks(every, 4) == [0, 4, 8, 12]
    assert per_rank.sample_ranks(every, 40) == every
    with pytest.raises(TracekitError, match="at least 1"):
        per_rank.sample_ranks(every, 0)


def test_cli_options(cpu_run):
    d = cpu_run.trace_dir
    r = CliRunner().invoke(cli, ["analyze", "temporal_breakdown", d, "--ranks", "1,3", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "ranks: 2 of 4 (1, 3)" in r.output
    r = CliRunner().invoke(cli, ["analyze", "kernel_breakdown", d, "--sample-ranks", "2"])
    assert r.exit_code == 2 and "not a per-rank analysis" in r.output
    r = CliRunner().invoke(cli, ["analyze", "temporal_breakdown", d, "--ranks", "9"])
    assert r.exit_code == 2 and "--ranks '9': rank 9 is not in this run" in r.output
    assert "Traceback" not in r.output


@pytest.mark.slow  # starts a Dask cluster
def test_chunks_on_a_dask_cluster_are_identical_to_local(cpu_run, gpu_run):
    distributed = pytest.importorskip("distributed", reason="distributed not installed (pip install 'tracekit[dask]')")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=50)
    try:
        spec = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        for run, name in [(cpu_run, "temporal_breakdown"), (cpu_run, "exposed_comm"), (gpu_run, "comm_comp_overlap")]:
            _same(REGISTRY[name].func(run), per_rank.run_per_rank(run, name, {}, executor=spec, chunk_ranks=1))
    finally:
        cluster.close()


def test_chunks_cut_at_the_event_budget():
    events = {0: 3, 1: 3, 2: 5, 3: 1, 4: 9}
    assert per_rank.chunks([0, 1, 2, 3, 4], events, budget=6) == [[0, 1], [2, 3], [4]]  # 4 alone: over the budget
    assert per_rank.chunks([0, 1, 2], None, budget=2) == [[0, 1], [2]]


def test_one_rank_asked_for_is_not_chunked_away(cpu_run):
    whole = REGISTRY["temporal_breakdown"].func(cpu_run, rank=2)
    _same(whole, per_rank.run_per_rank(cpu_run, "temporal_breakdown", {"rank": 2}, chunk_ranks=1))
    with pytest.raises(TracekitError, match="--rank 9: not in this trace"):
        per_rank.run_per_rank(cpu_run, "temporal_breakdown", {"rank": 9}, chunk_ranks=1)
