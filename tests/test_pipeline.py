"""Re-layout what-ifs ([parallelism] tp, pp, micro_batches, schedule, sharding; replay/relayout.py): the pipeline
schedules against their closed forms, and the re-layout of a bundled run from its traces alone (no annotations;
sample_traces/ddp2_2hosts_100mbit, whose run.json the what-if does not need)."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings, strategies as st

import replay
import tracekit
from replay.pipeline import pipeline_makespan
from replay.scenario import scenario_from_dict

from .conftest import REPO


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 8), m=st.integers(1, 16), f=st.integers(1, 10_000), b=st.integers(1, 20_000),
       schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_uniform_stages_match_the_closed_form(P, m, f, b, schedule):
    # uniform stages, free transfers: (m + P - 1) (f + b), the classic pipeline bubble, for GPipe and 1F1B alike
    assert pipeline_makespan([f] * P, [b] * P, 0, m, schedule) == (m + P - 1) * (f + b)


@settings(max_examples=40, deadline=None)
@given(P=st.integers(2, 6), m=st.integers(1, 12), f=st.integers(1, 5_000), b=st.integers(1, 10_000),
       p2p=st.integers(1, 20_000), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_transfers_only_add_time_and_a_link_carries_one_message_at_a_time(P, m, f, b, p2p, schedule):
    free = pipeline_makespan([f] * P, [b] * P, 0, m, schedule)
    paid = pipeline_makespan([f] * P, [b] * P, p2p, m, schedule)
    assert paid >= free + 2 * (P - 1) * p2p  # the first activation's trip there and the last gradient's back
    # a transfer longer than a stage's work paces the pipeline: m of them in a row on each link, both ways
    if p2p > f + b:
        assert paid >= m * p2p


def test_1f1b_slow_stages_pace_it():
    base = pipeline_makespan([10, 10, 10], [20, 20, 20], 0, 6, "1f1b")
    assert pipeline_makespan([10, 10, 10], [20, 20, 20], 5, 6, "1f1b") > base
    # the slow stage paces it
    assert pipeline_makespan([10, 30, 10], [20, 60, 20], 0, 6, "1f1b") >= (6 - 1) * 90 + 3 * 30


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """A bundled 2-rank DDP run, its run.json left behind: the traces alone."""
    d = tmp_path_factory.mktemp("ddp") / "run"
    d.mkdir()
    for f in (REPO / "sample_traces" / "ddp2_2hosts_100mbit").iterdir():
        if f.name != "run.json" and f.is_file():
            shutil.copy(f, d / f.name)
    return tracekit.open(str(d), store=str(d.parent / "st"))


def _steps(run, doc):
    return replay.run(run, scenario_from_dict(doc, "x") if doc else None).summary().predicted_step_ns


def test_the_runs_own_layout_is_the_baseline(ddp):
    same = {"dp": 2, "tp": 1, "pp": 1, "micro_batches": 1, "sharding": "none"}
    assert (_steps(ddp, {"parallelism": same}) == _steps(ddp, None)).all()


def test_a_layout_changed_and_changed_back_is_the_baseline(ddp):
    res = replay.run(ddp, scenario_from_dict({"parallelism": {"tp": 2}}, "x"))
    assert any("dp 2, tp 1, pp 1 -> dp 1, tp 2, pp 1" in n for n in res.notes)
    # the formula of the run's own layout is the denominator of every re-layout: back to it is exactly 1
    from analyses import depgraph
    from replay import memory, relayout
    from replay.structure import structure

    g = depgraph.build(ddp)
    facts = memory.op_facts(ddp, g)
    src, _ = relayout.source_layout(ddp, g, facts)
    assert (src.dp, src.tp, src.pp, src.sharding) == (2, 1, 1, "none")  # from the traces, no run.json
    s = structure(ddp, g, facts, 1)
    assert s.colwise and s.rowwise and s.hidden > 0 and s.tokens > 0


def test_a_free_network_can_only_shorten_a_tensor_parallel_step(ddp):
    tp2 = _steps(ddp, {"parallelism": {"tp": 2}})
    free = _steps(ddp, {"parallelism": {"tp": 2}, "network": {"bandwidth_scale": 1000.0, "latency_scale": 0.001}})
    assert (free < tp2).all()


@pytest.mark.parametrize("par, message", [
    ({"tp": 3}, "tp x pp = 3 does not divide the run's 2 ranks"),
    ({"dp": 1, "pp": 64}, "pp = 64: the model has"),
    ({"dp": 1, "tp": 3}, "tp = 3 does not divide"),
    ({"sharding": "fsdp", "pp": 2, "micro_batches": 4}, "sharding = 'fsdp' is modelled with pp = 1"),
])
def test_impossible_layouts_are_one_clear_error(ddp, par, message):
    with pytest.raises(tracekit.TracekitError, match=message.replace("(", r"\(")):
        replay.run(ddp, scenario_from_dict({"parallelism": par}, "x"))
