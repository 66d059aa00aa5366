"""Re-layouts of the bundled layout samples from their traces alone (replay/relayout.py, replay/structure.py,
replay/dims.py): each sample's own layout is its baseline, what the trace shows of each, and the memory columns."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import replay
import tracekit
from analyses import depgraph
from replay import memory, relayout
from replay.scenario import scenario_from_dict
from replay.structure import structure
from replay.whatif import whatif

from .conftest import REPO

LAYOUTS = REPO / "sample_traces" / "layouts"
# sample -> (dp, tp, pp, micro_batches, schedule, sharding) as recorded (its run.json, which the re-layout never reads)
TRUTH = {
    "fsdp_2hosts_100mbit": (2, 1, 1, 1, None, "fsdp"),
    "tp_2hosts_100mbit": (1, 2, 1, 1, None, "none"),
    "pp_gpipe_2hosts_100mbit": (1, 1, 2, 4, "gpipe", "none"),
    "pp_1f1b_2hosts_100mbit": (1, 1, 2, 4, "1f1b", "none"),
    "dp_pp_2hosts_100mbit": (2, 1, 2, 4, "gpipe", "replicate"),
}


def _traces_only(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "run.json" and f.is_file():
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    root = tmp_path_factory.mktemp("relayout")
    return {n: tracekit.open(str(_traces_only(LAYOUTS / n, root / n)), store=str(root / f"{n}.st")) for n in TRUTH}


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_a_samples_own_layout_is_its_baseline_and_its_trace_tells_it(samples, name):
    run = samples[name]
    g = depgraph.build(run)
    facts = memory.op_facts(run, g)
    src, _ = relayout.source_layout(run, g, facts)
    dp, tp, pp, m, schedule, sharding = TRUTH[name]
    assert (src.dp, src.tp, src.pp, src.micro_batches, src.sharding) == (dp, tp, pp, m, sharding)
    if schedule:
        assert src.schedule == schedule
    st = structure(run, g, facts, m)
    # the samples' 2-block transformer: 2 blocks in all, 1 a stage of a 2-stage pipeline (a stage with one block
    # repeats only at the micro-batch: its block holds the stage's embedding or head too)
    assert sum(w.blocks for w in st.ranks.values()) / (dp * tp) == 2
    # q, k, v and the MLP's first linear; the attention's output and the MLP's second
    assert (st.colwise, st.rowwise) == (4, 2)
    own = {"dp": dp, "tp": tp, "pp": pp, "micro_batches": m, "sharding": sharding}
    if schedule:
        own["schedule"] = schedule
    base = replay.run(run).summary().predicted_step_ns
    same = replay.run(run, scenario_from_dict({"parallelism": own}, "x")).summary().predicted_step_ns
    assert (same == base).all()


def test_a_re_layout_reports_the_measured_and_the_predicted_peak(tmp_path):
    run = tracekit.open(str(_traces_only(REPO / "sample_traces" / "memory" / "ddp_ckpt_none", tmp_path / "m")),
                        store=str(tmp_path / "st"))
    t = whatif(run, [scenario_from_dict({"name": "tp2", "parallelism": {"tp": 2}}, "tp2"),
                     scenario_from_dict({"name": "zero1", "parallelism": {"sharding": "zero1"}}, "zero1")])
    t = t.set_index("scenario")
    measured = t.loc["measured", "measured_peak_alloc_bytes"]
    assert measured == t.loc["measured", "predicted_peak_alloc_bytes"] and measured > 0
    assert (t.loc[["tp2", "zero1"], "measured_peak_alloc_bytes"] == measured).all()
    # zero1 shards Adam's state over the two ranks: the peak cannot grow; tensor parallelism moves it
    assert t.loc["zero1", "predicted_peak_alloc_bytes"] <= measured
    assert t.loc["tp2", "predicted_peak_alloc_bytes"] > 0


def test_replicate_holds_a_copy_of_its_stages_parameters(tmp_path):
    # FSDP2's replicate (DP x PP's data parallelism in torchtitan and the testbed) copies a stage's parameters
    # before its forward and holds the copy through its backward; its gradients are all-reduced as DDP's
    run = tracekit.open(str(_traces_only(REPO / "sample_traces" / "memory" / "ddp_ckpt_none", tmp_path / "m")),
                        store=str(tmp_path / "st"))
    scen = {k: scenario_from_dict({"name": k, "parallelism": {"sharding": k}}, k) for k in ("none", "replicate")}
    for k in ("none", "replicate"):
        scen[f"{k}_pp2"] = scenario_from_dict(
            {"name": f"{k}_pp2", "parallelism": {"sharding": k, "pp": 2, "dp": 1}}, f"{k}_pp2")
    t = whatif(run, list(scen.values())).set_index("scenario")
    model = replay.run(run, scen["replicate"]).info.relayout.work.model_bytes
    none, rep = t.loc["none", "predicted_peak_alloc_bytes"], t.loc["replicate", "predicted_peak_alloc_bytes"]
    assert none == t.loc["measured", "measured_peak_alloc_bytes"]  # the run's own layout
    assert rep - none == pytest.approx(model, abs=1)
    assert t.loc["replicate", "predicted_step_ns"] == t.loc["none", "predicted_step_ns"]
    assert any("replicate from a run without FSDP2" in n for n in t.attrs["notes"]["replicate"])
    # a stage holds half the model, and a copy of that half
    pp2 = t.loc["replicate_pp2", "predicted_peak_alloc_bytes"] - t.loc["none_pp2", "predicted_peak_alloc_bytes"]
    assert pp2 == pytest.approx(model / 2, abs=1)


def test_an_fsdp_runs_staged_gradients_are_not_resized_as_its_shards():
    # an FSDP x TP rank holds its sharded gradients (the model's / (tp x dp)) and, while a block's reduce-scatter is
    # staged, that block's unsharded ones on top: re-sized as shards they made a DDP or pipeline layout's peak 29-39%
    # over (the memory runs); whole already, a layout without FSDP holds none of them
    from types import SimpleNamespace

    w = SimpleNamespace(model_bytes=800.0)
    src = relayout.Layout(dp=2, tp=2, pp=1, sharding="fsdp")
    rest = 800.0 / (2 * 2)
    curve = np.array([0.0, rest / 2, rest + 60.0, rest])
    ddp = relayout.Layout(dp=2, tp=1, pp=1, sharding="none")
    assert relayout._gradients(curve, w, src, ddp).tolist() == [0.0, 400.0, 800.0, 800.0]
    # an FSDP layout keeps them, as its blocks' (/ tp x pp: a block's whole gradients without the split)
    fsdp = relayout.Layout(dp=4, tp=1, pp=1, sharding="fsdp")
    assert relayout._gradients(curve, w, src, fsdp).tolist() == [0.0, 100.0, 320.0, 200.0]
    # a run without FSDP: its gradients re-sized as a whole
    assert relayout._gradients(curve, w, ddp, src).tolist() == (curve / 4).tolist()


def test_a_pipelines_accumulation_transients_are_not_resized_as_its_share():
    # a pipeline stage of 4 micro-batches holds its gradients (its parameters') and, while AccumulateGrad adds a
    # micro-batch's gradient to the one before, that gradient on top: re-sized x2 as the stage's share they made a
    # DDP layout's peak 12-20% over (the memory runs, checkpointed); one micro-batch a step adds none
    from types import SimpleNamespace

    w = SimpleNamespace(model_bytes=800.0)
    gpipe = relayout.Layout(dp=1, tp=1, pp=2, micro_batches=4, schedule="gpipe")
    own = 410.0  # the stage's parameters, a little over the average share (400)
    curve = np.array([0.0, 200.0, own, own + 50.0, own + 100.0, own])
    ddp = relayout.Layout(dp=2, tp=1, pp=1)
    assert relayout._gradients(curve, w, gpipe, ddp, own, 30.0).tolist() == [0.0, 400.0, 820.0, 820.0, 820.0, 820.0]
    # a layout that accumulates keeps the run's transients as they were
    one_f1b = relayout.Layout(dp=1, tp=1, pp=2, micro_batches=8, schedule="1f1b")
    assert relayout._gradients(curve, w, gpipe, one_f1b, own, 30.0).tolist() == curve.tolist()
    # from a run of one micro-batch a step: one gradient of the largest, from the first backward on
    flat = np.array([0.0, 400.0, 800.0, 800.0])
    assert relayout._gradients(flat, w, ddp, gpipe, 800.0, 30.0).tolist() == [0.0, 230.0, 430.0, 430.0]
    # the re-sizing alone where neither side accumulates
    tp = relayout.Layout(dp=1, tp=2, pp=1)
    assert relayout._gradients(flat, w, ddp, tp, 800.0, 30.0).tolist() == (flat / 2).tolist()


@pytest.mark.parametrize("sample, checkpointed", [("ddp_ckpt_full", True), ("ddp_ckpt_none", False)])
def test_a_checkpointed_blocks_input_is_whole_on_every_tensor_parallel_rank(tmp_path, sample, checkpointed):
    # a checkpointed block keeps its input only, which tensor parallelism (without sequence parallelism) does not
    # split: the memory runs' TP and DDP blocks with checkpointing both keep 512 B a token (d_model 128, fp32).
    # Split as a whole block's activations, a pipeline -> TP peak was 17% under and TP -> GPipe 11% over
    tp_f = relayout._tp_activations(1, 2)
    assert tp_f == pytest.approx((10 + 24 / 2) / 34)
    with tracekit.open(str(REPO / "sample_traces" / "memory" / sample), store=str(tmp_path / "st")) as run:
        t = whatif(run, [scenario_from_dict({"name": "x", "parallelism": {"dp": 1, "tp": 2, "pp": 1}}, "x")])
    note = [n for n in t.attrs["notes"]["x"] if n.startswith("peak memory:")]
    assert len(note) == 1 and ("not a checkpointed block's input" in note[0]) == checkpointed
    plan = relayout.Plan(*[None] * 4, checkpointed=checkpointed)
    assert relayout._kept_split(plan, tp_f) == (1.0 if checkpointed else tp_f)


def test_an_fsdp_layout_holds_no_unsharded_parameters_while_the_loss_runs(tmp_path):
    # FSDP2 gathers a module's parameters in its hooks; the loss runs on the model's output, outside them (the
    # memory runs' FSDP x TP rank holds none at the loss's backward, where DDP peaks): the events inside the
    # cross-entropy and inside its backward nodes (LogSoftmaxBackward0, NllLossBackward0) are the loss's
    with tracekit.open(str(REPO / "sample_traces" / "memory" / "ddp_ckpt_none"), store=str(tmp_path / "st")) as run:
        out = relayout._outside_loss(run, {})
        series = relayout._category_series(run, {})
        spans = run.sql("SELECT rank, name, ts_ns, ts_ns + dur_ns AS end_ns FROM events WHERE ph = 'X' AND name IN "
                        "('aten::cross_entropy_loss', 'LogSoftmaxBackward0', 'NllLossBackward0')")
    assert set(out) == set(series)
    for key, outside in out.items():
        t = series[key].index.to_numpy()
        mine = spans[spans["rank"] == key[0]]
        assert {"aten::cross_entropy_loss", "LogSoftmaxBackward0"} <= set(mine.name)
        inside = np.zeros(len(t), bool)
        for a, b in zip(mine.ts_ns, mine.end_ns):
            inside |= (t >= a) & (t < b)
        assert inside.any() and not outside[inside].any()
        # the rest of the step is the model's: the forward's blocks, the head, the backward's other nodes
        assert outside.sum() > 0.9 * len(t)


@pytest.mark.slow  # a real 2-rank FSDP2 job on gloo
def test_fsdps_unsharded_copies_are_in_an_fsdp_layouts_peak_only(tmp_path):
    # the parameters at an FSDP run's CPU peak are the unsharded copies its all-gathers made (the state was made
    # before profiling and the CPU trace does not hold it): DDP has no such copies, holds whole gradients and no
    # reduce-scatter staging, and peaks elsewhere in the step; the same model recorded under DDP is the truth
    pytest.importorskip("torch")
    import analyses
    from tracekit.capture.layouts import LayoutConfig, run as record

    # two warm-up steps: DDP rebuilds its gradient buckets in its second step's forward (a one-off the steady
    # state does not repeat)
    model = dict(ranks=2, d_model=64, layers=2, heads=4, vocab=256, seq_len=32, batch_size=8, steps=3, warmup=2,
                 timed_steps=0, profile_memory=True)
    for layout in ("fsdp", "ddp"):
        record(LayoutConfig(out_dir=str(tmp_path / layout), layout=layout, **model))
    run = tracekit.open(str(_traces_only(tmp_path / "fsdp", tmp_path / "traces")), store=str(tmp_path / "st"))
    t = whatif(run, [scenario_from_dict({"name": "ddp", "parallelism": {"sharding": "none"}}, "ddp"),
                     scenario_from_dict({"name": "own", "parallelism": {"sharding": "fsdp"}}, "own")])
    t = t.set_index("scenario")
    measured = int(t.loc["measured", "measured_peak_alloc_bytes"])
    assert t.loc["own", "predicted_peak_alloc_bytes"] == measured
    at = analyses.memory_breakdown(run).pivot_table(index="rank", columns="category", values="bytes_at_peak")
    assert (analyses.memory_model_state(run).pre_profiling_bytes_at_peak == 0).all()
    assert at["parameters"].min() > 0
    with tracekit.open(str(tmp_path / "ddp"), store=str(tmp_path / "st_ddp")) as ddp:
        truth = int(analyses.memory_peak(ddp).peak_allocated_bytes.max())
    assert t.loc["ddp", "predicted_peak_alloc_bytes"] == pytest.approx(truth, rel=0.10)


def test_fsdps_own_work_held_inside_another_node_is_told_apart(tmp_path):
    # FSDP2's post-backward reduce runs inside the autograd node of its RegisterPostBackwardFunction and its
    # pre-backward unshard inside the node of a block output's grad_fn: those nodes do not start inside an FSDP::
    # range, yet the time the range covers is FSDP's own work, which only a layout FSDP2 runs spends
    from types import SimpleNamespace

    from replay.structure import _inside

    from .conftest import write_trace

    def rng(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    write_trace(tmp_path / "t" / "rank0.json", [
        rng("ProfilerStep#1", 0, 1000),
        rng("FSDP::post_backward_reduce (layers.0)", 120, 50),
        rng("FSDP::pre_backward (layers.0)", 150, 40),  # overlaps the one before: their union counts once
        rng("FSDP::pre_forward (layers.1)", 300, 20)])
    run = tracekit.open(str(tmp_path / "t"), store=str(tmp_path / "st"))
    # graph nodes (us -> ns): one holding two ranges, one starting inside one, one running past one's end, one apart
    start = np.array([100, 130, 310, 400]) * 1000
    dur = np.array([100, 10, 30, 10]) * 1000
    g = SimpleNamespace(rank=np.zeros(4, np.int64), start_ns=start, dur_ns=dur, kind=np.zeros(4, np.int8))
    starts, covered = _inside(g, run, "FSDP::")
    assert starts.tolist() == [False, True, True, False]
    assert covered.tolist() == [70_000, 10_000, 10_000, 0]


def test_an_optimizers_floors_follow_its_tensors_and_the_rest_its_bytes(samples):
    # Adam on CPU runs a handful of ops per parameter tensor: a shard is a tensor still (FSDP, TP), a pipeline stage
    # updates its share of them; only the time beyond the ops' floors follows the bytes a rank updates
    run = samples["fsdp_2hosts_100mbit"]
    g = depgraph.build(run)
    facts = memory.op_facts(run, g)
    src, _ = relayout.source_layout(run, g, facts)
    st = structure(run, g, facts, src.micro_batches)
    assert all(w.optimizer_floor_ns > 0 and w.optimizer_ns > 0 for w in st.ranks.values())
    w = relayout.work(st, src, [])
    from replay.links import INTER, INTRA, LinkParams

    costs = relayout.Costs(LinkParams({INTER: 0.05, INTRA: 1.0}, {INTER: 1e5, INTRA: 1e4}), 1)
    # (FSDP2's parameters are DTensors: their dispatch on top; DDP's and a pipeline's are plain tensors)
    lays = {relayout.Layout(2, sharding="fsdp"): w.optimizer_wrapper_ns, relayout.Layout(2): 0.0,
            relayout.Layout(1, pp=2, micro_batches=2): 0.0}
    parts = {lay: relayout.step_ns(st, w, lay, src, costs)["optimizer_ns"] - wrap for lay, wrap in lays.items()}
    sharded, whole, staged = parts.values()
    floor = w.optimizer_floor_ns
    assert sharded - floor == pytest.approx((whole - floor) / 2)
    assert staged == pytest.approx(floor / 2 + (sharded - floor))


def test_fsdps_gradient_staging_is_split_by_tensor_parallelism():
    # an FSDP2 run without tensor parallelism holds FSDP2's staging only among its communication buffers: a block's
    # unsharded gradients for its reduce-scatter, which tensor parallelism splits (the memory runs' FSDP x TP rank
    # stages 0.40 MB where the FSDP one stages 0.79); a layout without FSDP2 has no staging, one without tensor
    # parallelism no collective outputs of it
    lay = relayout.Layout
    assert relayout._comm_kept(lay(2, sharding="fsdp"), lay(2, tp=2, sharding="fsdp")) == 0.5
    assert relayout._comm_kept(lay(2, sharding="fsdp"), lay(2, sharding="fsdp")) == 1.0
    assert relayout._comm_kept(lay(2, sharding="fsdp"), lay(2)) == 0.0
    assert relayout._comm_kept(lay(1, tp=2), lay(2)) == 0.0
    # tensor parallelism's own buffers (its collectives' outputs) are a block boundary's, which it does not split
    assert relayout._comm_kept(lay(1, tp=2), lay(2, tp=2, sharding="fsdp")) == 1.0


def test_a_collective_between_hosts_is_timed_alone_only_when_its_hosts_nics_carry_nothing_else(samples):
    # dp x pp on 2 hosts: the data-parallel groups (0, 2) and (1, 3) both cross the hosts' NICs, each host holding
    # one rank of each. A group's all-reduce with nothing else on its own ranks still shares the NICs with the other
    # group's: it tells the algorithm's time only when neither host has another collective between hosts in flight
    from replay.links import INTER, INTRA, LinkParams

    run = samples["dp_pp_2hosts_100mbit"]
    g = depgraph.build(run)
    prm = LinkParams({INTER: 0.0125, INTRA: 1.0}, {INTER: 1e5, INTRA: 1e4})
    costs = relayout.Costs(prm, 2, "gloo")
    # modelled alone, one group's all-reduce has the NIC's whole rate: the bandwidth part of two sharing it, halved
    shared, alone = costs.ns("all_reduce", 1e6, 2, 2), costs.ns("all_reduce", 1e6, 2, 2, alone=True)
    latency = costs.ns("all_reduce", 1.0, 2, 2, alone=True)
    assert shared - latency == pytest.approx(2 * (alone - latency), rel=1e-6)
    # every data-parallel all-reduce of the sample overlaps the other group's on the same hosts
    c = run.analyze("collectives")
    ar = c[c.op == "all_reduce"].assign(host=lambda d: d["rank"] // 2, grp=lambda d: d.pg_ranks.astype(str))
    assert ar.grp.nunique() == 2
    for _, x in ar.iterrows():
        other = ar[(ar.host == x.host) & (ar.grp != x.grp)]
        assert ((other.start_ns < x.end_ns) & (other.end_ns > x.start_ns)).any()
    # so none is taken as the algorithm's own time (the same sample's all-reduces, read per rank only, were: 0.97)
    assert ("all_reduce", INTER) not in costs.with_run(run, g).op_factor
    # one rank a host: the NIC is the rank's own, and the run's lone collectives are measured as before
    fsdp = samples["fsdp_2hosts_100mbit"]
    got = relayout.Costs(prm, 1, "gloo").with_run(fsdp, depgraph.build(fsdp)).op_factor
    assert set(got) == {("all_gather", INTER), ("all_reduce", INTER)}
