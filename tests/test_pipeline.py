"""Tensor/pipeline-parallel what-ifs: the 1F1B schedule against its closed form, and the transforms on the
bundled sample that carries a layer structure (sample_traces/ddp2_layers)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import replay
import tracekit
from replay.pipeline import one_f_one_b
from replay.scenario import scenario_from_dict

from .conftest import REPO


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 8), m=st.integers(1, 16), f=st.integers(1, 10_000), b=st.integers(1, 20_000))
def test_1f1b_uniform_stages_match_the_closed_form(P, m, f, b):
    # uniform stages, free transfers: (m + P - 1) (f + b), the classic pipeline bubble
    assert one_f_one_b([f] * P, [b] * P, 0, m) == (m + P - 1) * (f + b)


def test_1f1b_transfers_and_slow_stages_only_add_time():
    base = one_f_one_b([10, 10, 10], [20, 20, 20], 0, 6)
    assert one_f_one_b([10, 10, 10], [20, 20, 20], 5, 6) > base
    assert one_f_one_b([10, 30, 10], [20, 60, 20], 0, 6) >= (6 - 1) * 90 + 3 * 30  # the slow stage paces it


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    return tracekit.open(REPO / "sample_traces" / "ddp2_layers", store=str(tmp_path_factory.mktemp("l") / "st"))


def _steps(run, doc):
    return replay.run(run, scenario_from_dict(doc, "x") if doc else None).summary().predicted_step_ns


def test_unchanged_layout_is_the_baseline(layers):
    assert (_steps(layers, {"parallelism": {"tp": 1, "pp": 1, "micro_batches": 1}}) == _steps(layers, None)).all()


def test_splits_shorten_the_step_and_more_micro_batches_shrink_the_bubble(layers):
    base = _steps(layers, None)
    tp2 = _steps(layers, {"parallelism": {"tp": 2}})
    pp2m4 = _steps(layers, {"parallelism": {"pp": 2, "micro_batches": 4}})
    pp2m8 = _steps(layers, {"parallelism": {"pp": 2, "micro_batches": 8}})
    assert (tp2 < base).all() and (pp2m4 < base).all()
    assert (pp2m8 <= pp2m4).all()
    # tensor parallelism adds its all-reduces: it cannot beat halving the compute for free
    free = _steps(layers, {"parallelism": {"tp": 2}, "network": {"bandwidth_scale": 1000.0, "latency_scale": 0.001}})
    assert (free <= tp2).all()


@pytest.mark.slow  # ingests and replays a layered run
def test_split_needs_a_layer_structure(tmp_path):
    run = tracekit.open(REPO / "sample_traces" / "ddp2_2hosts_100mbit", store=str(tmp_path / "st"))
    with pytest.raises(tracekit.TracekitError, match="no layer.<i> annotations"):
        replay.run(run, scenario_from_dict({"parallelism": {"pp": 2, "micro_batches": 4}}, "x"))
    with pytest.raises(tracekit.TracekitError, match="at most 4 stages"):
        replay.run(tracekit.open(REPO / "sample_traces" / "ddp2_layers", store=str(tmp_path / "l")),
                   scenario_from_dict({"parallelism": {"pp": 8}}, "x"))
