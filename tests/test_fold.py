"""Symmetric-rank folding: a 64-rank set replayed with and without folding agrees within 1%."""
from __future__ import annotations

import inspect

import pytest

import replay
import tracekit
from replay.scenario import scenario_from_dict

from .conftest import many_rank_run

pytestmark = pytest.mark.slow  # 64-rank replays


@pytest.fixture(scope="module")
def run64(tmp_path_factory):
    return many_rank_run(tmp_path_factory, 64)


@pytest.mark.parametrize("doc", [None, {"network": {"bandwidth_scale": 4.0}},
                                 {"compute": {"rank_slowdown": {"5": 2.0}}}])
def test_folded_and_unfolded_replays_agree_within_1pct(run64, doc):
    sc = scenario_from_dict(doc, "s") if doc else None
    full = replay.run(run64, sc, fold=False)
    folded = replay.run(run64, sc, fold=True)
    assert full.folding is None and folded.folding is not None
    assert folded.folding.folded_ranks >= 48 and folded.graph.n_nodes < full.graph.n_nodes / 4
    a, b = full.summary(), folded.summary()
    assert a["rank"].tolist() == b["rank"].tolist() == list(range(64))
    diff = ((b.predicted_step_ns - a.predicted_step_ns).abs() / a.predicted_step_ns * 100).max()
    assert diff <= 1.0, diff
    assert any("folded" in n for n in folded.notes)
    if doc and "compute" in doc:  # a rank the scenario changes on its own is replayed, not folded
        assert folded.folding.representative[5] == 5


def test_auto_folds_above_64_ranks_and_out_needs_unfolded(run64, tmp_path):
    assert replay.run(run64).folding is None  # 64 ranks: not above the threshold
    folded = replay.run(run64, fold=True)
    with pytest.raises(tracekit.TracekitError, match="--no-fold"):
        folded.write_store(str(tmp_path / "out"))


def test_a_folded_whatif_gives_the_unfolded_step_and_exposed_communication(run64):
    # `tracekit whatif` folds above 64 ranks: it measured exposed communication on the full graph with the
    # folded schedule (an IndexError on every whatif of a 1,024-rank set)
    from replay.whatif import whatif

    sc = scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "links4x")
    full = whatif(run64, [sc], fold=False).set_index("scenario")
    folded = whatif(run64, [sc], fold=True).set_index("scenario")
    a, b = full.loc["links4x", "predicted_step_ns"], folded.loc["links4x", "predicted_step_ns"]
    assert abs(b - a) <= 0.01 * a, (a, b)
    # the job's exposed communication is its worst rank's; a folded rank is timed as its representative, whose
    # measured times are within the folding tolerance (5%) of its own
    a, b = full.loc["links4x", "exposed_comm_ns"], folded.loc["links4x", "exposed_comm_ns"]
    tol = inspect.signature(replay.run).parameters["fold_tolerance"].default
    assert abs(b - a) <= tol * a, (a, b)
