"""Fold first: a folded replay of every rank plans its classes from the store and builds only its representatives'
graph; that graph, and the replay, are those of the graph of every rank cut down to the same classes."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import tracekit
from analyses import depgraph
from analyses.depgraph.tracks import working_spans
from analyses.depgraph.wide import _tracks, caller_spans
from replay import fold as _fold
from replay.replayer import replay
from replay.scenario import scenario_from_dict
from replay.whatif import whatif

from .conftest import many_rank_run

pytestmark = pytest.mark.slow  # 72-rank replays


@pytest.fixture(scope="module")
def run72(tmp_path_factory):
    return many_rank_run(tmp_path_factory, 72)


@pytest.fixture(scope="module")
def full72(run72):
    return depgraph.build(run72)


@pytest.fixture(scope="module")
def wide72(run72):
    return depgraph.run_wide(run72)


def test_store_classes_never_join_ranks_whose_graphs_differ(full72, wide72):
    folding = _fold.plan_from_store(wide72.shapes)
    assert folding.folded_ranks >= 48
    shape = _fold.plan(full72, tolerance=1e9).representative  # the graph's shape classes alone
    assert all(shape[r] == shape[rep] for r, rep in folding.representative.items())


def test_the_representatives_graph_is_the_full_graph_folded(run72, full72, wide72):
    folding = _fold.plan_from_store(wide72.shapes)
    reps = sorted(set(folding.representative.values()))
    built = _fold.fold_built(depgraph.build(run72, reps, wide=wide72), folding)
    cut = _fold.fold(full72, folding)
    assert built.origin_ns == cut.origin_ns and built.ranks == cut.ranks
    for k in ("kind", "rank", "event_id", "start_ns", "dur_ns", "coll", "name", "src", "dst", "from_end", "edge_kind",
              "lag_ns"):
        assert np.array_equal(getattr(built, k), getattr(cut, k)), k
    assert built.colls.astype(str).equals(full72.colls.astype(str))


def test_the_sql_working_spans_are_working_spans(run72):
    from analyses._sql import query
    from analyses.depgraph.load import _async_annotations_out

    ranks = list(range(4))
    cpu = _async_annotations_out(query(run72, "_graph_cpu", ranks=ranks))
    cpu = cpu.assign(end_ns=cpu.ts_ns + cpu.dur_ns)
    want = working_spans(cpu)
    threads = pd.DataFrame(list(want), columns=["rank", "pid", "tid"])  # every CPU thread, not only the callers
    got = caller_spans(_tracks(run72, ranks, threads))
    assert set(got) == {k for k, (s, _) in want.items() if len(s)}
    for key, (s, e) in got.items():
        assert np.array_equal(s, want[key][0]) and np.array_equal(e, want[key][1]), key


@pytest.mark.parametrize("doc", [None, {"network": {"bandwidth_scale": 4.0}},
                                 {"compute": {"rank_slowdown": {"5": 2.0}}}])
def test_fold_first_replays_as_the_full_graph_folded_the_same_way(run72, full72, wide72, doc):
    sc = scenario_from_dict(doc, "s") if doc else None
    first = replay(run72, sc, fold="auto", wide=wide72)
    assert first.folding is not None and first.graph.n_nodes < full72.n_nodes / 4
    cut = replay(run72, sc, graph=full72, fold=first.folding)
    assert first.steps.equals(cut.steps)
    assert first.summary()["rank"].tolist() == list(range(72))
    if doc and "compute" in doc:  # a rank the scenario changes on its own is replayed, not folded
        assert first.folding.representative[5] == 5


def test_the_folded_baseline_is_exact(run72, wide72):
    res = replay(run72, fold=True, wide=wide72)
    st = res.steps
    reps = st[st["rank"].isin(set(res.folding.representative.values()))]
    assert (reps.predicted_step_ns == reps.measured_step_ns).all()
    assert (reps.predicted_end_ns == reps.measured_end_ns).all()
    # a folded rank: its own measured steps (the store's), its representative's predicted ones
    rep = res.folding.representative
    folded = st[st["rank"].map(rep) != st["rank"]]
    assert len(folded)
    by = st.set_index(["rank", "step"])
    for r, s, m, p in zip(folded["rank"], folded.step, folded.measured_step_ns, folded.predicted_step_ns):
        assert p == by.loc[(rep[r], s), "measured_step_ns"]
    measured = run72.sql("SELECT rank, step, end_ns - ts_ns AS d FROM steps ORDER BY rank, step")
    assert st.sort_values(["rank", "step"]).measured_step_ns.tolist() == measured.d.tolist()


def test_a_fold_first_whatif_matches_the_full_graph_folded_the_same_way(run72, full72, monkeypatch):
    sc = scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "links4x")
    first = whatif(run72, [sc], fold="auto").set_index("scenario")
    calls = []
    real = depgraph.build
    monkeypatch.setattr(depgraph, "build", lambda run, ranks=None, wide=None: calls.append(ranks) or real(run, ranks, wide))
    whatif(run72, [sc], fold="auto")
    assert calls and all(r is not None and len(r) < 72 for r in calls)  # no graph of every rank
    monkeypatch.undo()
    unfolded = whatif(run72, [sc], fold=False).set_index("scenario")
    for c in ("measured_step_ns", "measured_exposed_comm_ns"):
        assert first.loc["links4x", c] == unfolded.loc["links4x", c]
    a, b = unfolded.loc["links4x", "predicted_step_ns"], first.loc["links4x", "predicted_step_ns"]
    assert abs(b - a) <= 0.01 * a, (a, b)



def _same_wide(a, b):
    assert a.ranks == b.ranks and a.origin_ns == b.origin_ns and a.members == b.members
    for name in ("shapes", "colls", "laneless", "steps"):
        pd.testing.assert_frame_equal(getattr(a, name).reset_index(drop=True), getattr(b, name).reset_index(drop=True),
                                      obj=name)


def test_the_pass_over_every_rank_in_chunks_and_on_dask_is_the_whole_pass(run72, wide72, monkeypatch):
    """The graph's pass over the store runs a chunk of ranks at a time (a rank a chunk here), locally or on a Dask
    LocalCluster, and gives the whole pass's shapes, collective instances and origin; so does the what-if."""
    from analyses import per_rank

    sc = scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "links4x")
    local = whatif(run72, [sc], fold="auto").set_index("scenario")
    monkeypatch.setattr(per_rank, "CHUNK_EVENTS", 1)
    _same_wide(wide72, depgraph.run_wide(run72))
    distributed = pytest.importorskip("distributed", reason="distributed not installed (pip install 'tracekit[dask]')")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=50)
    try:
        spec = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        _same_wide(wide72, depgraph.run_wide(run72, executor=spec))
        on = whatif(run72, [sc], fold="auto", executor=spec).set_index("scenario")
        pd.testing.assert_frame_equal(local, on)
    finally:
        cluster.close()

def test_nccl_collectives_of_unbuilt_ranks_keep_the_representatives_graph(tmp_path):
    # a real NCCL job (Megatron TP8): its ranks differ, so nothing folds on its own; folding ranks 4-7 into 0-3 by
    # hand still gives the graph of every rank cut down, through the kernels' participants
    from .conftest import shared_trace_dir

    run = tracekit.open(shared_trace_dir("astra-sim/megatron_tp8"), store=str(tmp_path / "store"))
    full, wide = depgraph.build(run), depgraph.run_wide(run)
    assert wide.colls.astype(str).equals(full.colls.astype(str)) and wide.origin_ns == full.origin_ns
    folding = _fold.Folding({r: r % 4 for r in range(8)}, 4, 0.05)
    built = _fold.fold_built(depgraph.build(run, [0, 1, 2, 3], wide=wide), folding)
    cut = _fold.fold(full, folding)
    for k in ("kind", "rank", "start_ns", "dur_ns", "coll", "src", "dst", "from_end", "edge_kind", "lag_ns"):
        assert np.array_equal(getattr(built, k), getattr(cut, k)), k
