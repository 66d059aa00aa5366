"""memory_breakdown and memory_category_timeline: what fills the allocator. A tiny trace built in code pins each
rule of the attribution (analyses/_memory_blocks.sql) to its category; recorded training runs (the layouts job
with profile_memory) and the shared GPU traces with [memory] events check that the categories add up to
memory_peak's peak exactly and that activations, parameters and optimizer state are where the model puts them."""
from __future__ import annotations

import pandas as pd
import pytest

import analyses
import tracekit

from .conftest import shared_trace_dir, write_trace

CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "communication_buffers", "other"]


def _op(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


class _Alloc:
    """[memory] events with a running Total Allocated that starts at `pre` bytes made before profiling."""

    def __init__(self, pre: int):
        self.total, self.events = pre, []

    def __call__(self, ts, addr, nbytes):
        self.total += nbytes
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                            "s": "t", "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": self.total,
                                               "Total Reserved": 0, "Device Type": 0, "Device Id": -1}})


P = 4 * 100  # the parameter: 100 floats
PRE = P + 2 * P + 50  # before profiling: the parameter, AdamW's two moments, 50 bytes of something else


def _training_step_events():
    """One step on CPU: forward, backward, AdamW step, with a block of each kind (times in us)."""
    a = _Alloc(PRE)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("data_loading", 10, 20, cat="user_annotation"),
          _op("aten::linear", 100, 50), _op("aten::gelu", 160, 20),
          _op("aten::cross_entropy_loss", 190, 10),
          _op("autograd::engine::evaluate_function: GeluBackward0", 300, 50), _op("GeluBackward0", 301, 48),
          _op("aten::gelu_backward", 305, 40),
          _op("autograd::engine::evaluate_function: AddmmBackward0", 360, 100), _op("AddmmBackward0", 361, 98),
          _op("aten::linear", 365, 30),  # activation checkpointing: the forward's linear run again in the backward
          _op("aten::mm", 400, 20),
          _op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 470, 20),
          _op("torch::autograd::AccumulateGrad", 471, 18, **{"Input Dims": [[100]], "Input type": ["float"]}),
          _op("c10d::allreduce_", 500, 30),
          _op("Optimizer.step#AdamW.step", 600, 100, cat="user_annotation"),
          _op("aten::addcdiv_", 650, 10, **{"Input Dims": [[100], [100], [100], []],
                                            "Input type": ["float", "float", "float", "Scalar"]}),
          _op("Optimizer.zero_grad#AdamW.zero_grad", 800, 10, cat="user_annotation")]
    a(15, 0x10, 8)           # data loading: other, lives to the end
    a(110, 0x20, 1000)       # forward linear: activation, freed in the backward
    a(165, 0x30, 2000)       # forward gelu: activation
    a(195, 0x40, 16)         # loss: other
    a(310, 0x50, 300)        # gelu_backward: a backward temporary, freed before the backward ends: other
    a(370, 0x60, 500)        # recompute under AddmmBackward0: activations
    a(410, 0x70, 64)         # mm in the backward, freed inside it: other (the peak: the first event at the most)
    a(415, 0x70, -64)
    a(420, 0x30, -2000)
    a(455, 0x50, -300)
    a(458, 0x60, -500)
    a(475, 0x80, 400)        # AccumulateGrad: the parameter's .grad, gradients
    a(510, 0x90, 128)        # in the all-reduce: communication buffer
    a(520, 0x90, -128)
    a(610, 0xA0, 77)         # optimizer step, lives past it: optimizer state
    a(620, 0xB0, 33)         # optimizer temporary freed inside it: other
    a(625, 0xB0, -33)
    a(650, 0x20, -1000)
    a(805, 0x80, -400)       # zero_grad frees the gradient
    return ev + a.events


@pytest.fixture
def tiny_training(tmp_path):
    d = tmp_path / "train"
    write_trace(d / "rank0.trace.json", _training_step_events(), rank=0, world_size=1)
    run = tracekit.open(d, store=str(tmp_path / "s"))
    yield run
    run.close()


def _by_category(df, rank=0, device_type=0):
    rows = df[(df["rank"] == rank) & (df["device_type"] == device_type)]
    return dict(zip(rows["category"], rows["bytes_at_peak"].astype(int)))


def test_each_rule_gives_its_category_and_they_add_up_to_the_peak(tiny_training):
    df = analyses.memory_breakdown(tiny_training)
    assert list(df.columns) == list(analyses.REGISTRY["memory_breakdown"].columns)
    assert list(df["category"]) == CATEGORIES
    peak = analyses.memory_peak(tiny_training).iloc[0]
    assert peak.peak_allocated_bytes == PRE + 8 + 1000 + 2000 + 16 + 300 + 500 + 64  # at 410 us
    assert (df["peak_ts_ns"] == peak.peak_allocated_ts_ns).all()
    assert _by_category(df) == {"parameters": P, "gradients": 0, "optimizer_state": 2 * P,
                                "activations": 1000 + 2000 + 500, "communication_buffers": 0,
                                "other": 50 + 8 + 16 + 300 + 64}
    assert df["bytes_at_peak"].sum() == peak.peak_allocated_bytes


def test_timeline_holds_every_category_at_every_event_and_the_breakdown_at_the_peak(tiny_training):
    tl = analyses.memory_category_timeline(tiny_training)
    assert list(tl.columns) == list(analyses.REGISTRY["memory_category_timeline"].columns)
    wide = tl.pivot_table(index="ts_ns", columns="category", values="bytes", aggfunc="last").ffill()
    mem = tiny_training.sql("SELECT ts_ns, total_allocated FROM memory ORDER BY ts_ns").set_index("ts_ns")
    assert (wide.sum(axis=1) == mem["total_allocated"].reindex(wide.index)).all()
    assert wide.loc[475_000]["gradients"] == 400  # AccumulateGrad's allocation: the parameter's .grad
    assert wide.loc[510_000]["communication_buffers"] == 128
    assert wide.loc[520_000]["communication_buffers"] == 0
    assert wide.loc[610_000]["optimizer_state"] == 2 * P + 77  # the moments made before profiling, and the new block
    assert wide.loc[620_000]["other"] - wide.loc[610_000]["other"] == 33
    assert wide.loc[805_000]["gradients"] == 0  # zero_grad
    peak = analyses.memory_peak(tiny_training).iloc[0]
    assert dict(wide.loc[peak.peak_allocated_ts_ns]) == _by_category(analyses.memory_breakdown(tiny_training))


def test_model_state_reads_the_optimizers_update(tiny_training):
    m = analyses.memory_model_state(tiny_training).iloc[0]
    assert (m.parameter_bytes, m.parameter_bytes_source, bool(m.adam)) == (P, "optimizer", True)
    assert m.pre_profiling_bytes_at_peak == PRE


def test_without_shapes_the_bytes_before_profiling_are_other_and_the_note_says_why(tmp_path):
    ev = [e for e in _training_step_events() if e["name"] not in ("aten::addcdiv_", "torch::autograd::AccumulateGrad")]
    write_trace(tmp_path / "t" / "rank0.trace.json", ev, rank=0, world_size=1)
    run = tracekit.open(tmp_path / "t", store=str(tmp_path / "s"))
    df = analyses.memory_breakdown(run)
    by = _by_category(df)
    assert by["parameters"] == by["optimizer_state"] == 0 and by["other"] == PRE + 8 + 16 + 300 + 64
    assert f"rank 0: {PRE:,} bytes allocated before profiling are in other" in df.attrs["note"]


def test_no_memory_events_gives_an_empty_table_and_memory_peaks_note(tiny_dir, tmp_path):
    ev = [e for e in _training_step_events() if e["name"] != "[memory]"]
    write_trace(tmp_path / "n" / "rank0.trace.json", ev, rank=0, world_size=1)
    run = tracekit.open(tmp_path / "n", store=str(tmp_path / "s"))
    for name in ("memory_breakdown", "memory_category_timeline"):
        df = run.analyze(name)
        assert df.empty and df.attrs["note"] == analyses.memory_peak(run).attrs["note"], name


def test_gpu_memory_events_are_attributed_like_cpu_ones(tiny_dir, tmp_path):
    # tiny_events: one 64-byte allocation per step on cuda:0 inside aten::mm in the step (the forward), never freed
    run = tracekit.open(tiny_dir, store=str(tmp_path / "s"))
    df = analyses.memory_breakdown(run)
    peak = analyses.memory_peak(run).set_index("rank")
    for rank, g in df.groupby("rank"):
        assert (g["device_type"] == 1).all()
        assert g["bytes_at_peak"].sum() == peak.loc[rank, "peak_allocated_bytes"]
        assert _by_category(g, rank, 1)["activations"] == 2 * 64  # both steps' allocations, alive at the peak


# --- recorded runs ---------------------------------------------------------------------------------------------

def _record(base, layout, checkpointing):
    from tracekit.capture import layouts

    pytest.importorskip("torch")
    cfg = layouts.LayoutConfig(out_dir=str(base / f"{layout}_{checkpointing}"), layout=layout, ranks=2, steps=2,
                               warmup=1, timed_steps=0, profile_memory=True, checkpointing=checkpointing)
    layouts.run(cfg)
    return cfg, tracekit.open(cfg.out_dir, store=str(base / f"{layout}_{checkpointing}.store"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    base = tmp_path_factory.mktemp("memory_runs")
    return {(lay, ck): _record(base, lay, ck) for lay in ("ddp", "fsdp") for ck in ("none", "full")}


def _peak_sums_match(run):
    df = analyses.memory_breakdown(run)
    sums = df.groupby(["rank", "device_type", "device_id"])["bytes_at_peak"].sum()
    peak = analyses.memory_peak(run).set_index(["rank", "device_type", "device_id"])["peak_allocated_bytes"]
    assert len(peak) and (sums.reindex(peak.index) == peak).all()
    return df


@pytest.mark.slow  # four real 2-rank gloo training jobs
def test_recorded_runs_add_up_and_checkpointing_cuts_the_activations(recorded):
    from tracekit.capture import layouts

    for lay in ("ddp", "fsdp"):
        act = {}
        for ck in ("none", "full"):
            cfg, run = recorded[(lay, ck)]
            df = _peak_sums_match(run)
            by = df.groupby("category")["bytes_at_peak"].max()
            act[ck] = by["activations"]
            assert by["activations"] > 0, (lay, ck)
            param_bytes = layouts.model_params(cfg) * 4  # fp32
            state = analyses.memory_model_state(run).set_index("rank")
            # the optimizer's update sees the parameters each rank holds: all of them under DDP, half under FSDP
            expect = param_bytes if lay == "ddp" else param_bytes / 2
            assert state["parameter_bytes"].tolist() == pytest.approx([expect] * 2, rel=0.01), (lay, ck)
            assert state["adam"].all()
            # never more parameters than a rank can hold: its shard plus, under FSDP, every module gathered at once
            # (prefetching holds two blocks and the root); never more optimizer state than Adam's two per parameter
            bound = param_bytes if lay == "ddp" else param_bytes / 2 + param_bytes
            assert by["parameters"] <= bound and by["optimizer_state"] <= 2 * param_bytes, (lay, ck)
        assert act["full"] < act["none"] / 2, (lay, act)


@pytest.mark.slow  # ingests the shared GPU traces
@pytest.mark.parametrize("rel,rank_from", [("hta/df_index_resolver", "auto"), ("tracelens/h100_qwen_inference", "order")])
def test_shared_gpu_traces_add_up_to_the_peak(tmp_path, rel, rank_from):
    run = tracekit.open(shared_trace_dir(rel), store=str(tmp_path / "s"), rank_from=rank_from)
    df = _peak_sums_match(run)
    gpu = df[df["device_type"] == 1]
    assert len(gpu) == len(CATEGORIES) and gpu.set_index("category").loc["activations", "bytes_at_peak"] > 0
    # neither trace records shapes: the weights loaded before profiling are other, and the note says so
    assert "bytes allocated before profiling are in other" in df.attrs["note"]


def test_a_free_the_cpu_trace_lost_comes_off_the_total_where_the_address_is_allocated_again(tmp_path):
    # PyTorch's CPU allocator writes a free to the trace only from a thread the profiler follows: a block freed on
    # gloo's worker thread keeps its bytes in Total Allocated for good. Its address allocated again says it had
    # ended. The CUDA caching allocator's totals count every thread's frees: its events are kept as written.
    def events(device_type):
        a = _Alloc(0)
        ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), _op("aten::linear", 100, 400)]
        a(110, 0x10, 1000)   # freed on an unprofiled thread: no event
        a(200, 0x10, 600)    # its address again: 1600 recorded, 600 live
        a(210, 0x20, 300)    # 1900 recorded, 900 live
        a(300, 0x10, -600)
        a(310, 0x20, -300)   # 1000 recorded for good, nothing live
        for e in a.events:
            e["args"]["Device Type"], e["args"]["Device Id"] = device_type, (0 if device_type else -1)
        return ev + a.events

    for device_type, want_peak, want_totals in ((0, 1000, [1000, 600, 900, 300, 0]),
                                                (1, 1900, [1000, 1600, 1900, 1300, 1000])):
        d = tmp_path / f"dev{device_type}"
        write_trace(d / "rank0.trace.json", events(device_type), rank=0, world_size=1)
        with tracekit.open(d, store=str(tmp_path / f"s{device_type}")) as run:
            tl = analyses.memory_timeline(run)
            assert tl.allocated_bytes.tolist() == want_totals
            assert tl.lost_free_bytes.tolist() == ([0, 1000, 1000, 1000, 1000] if device_type == 0 else [0] * 5)
            peak = analyses.memory_peak(run)
            assert peak.peak_allocated_bytes.tolist() == [want_peak]
            assert peak.allocated_bytes_end.tolist() == [want_totals[-1]]
            assert analyses.memory_breakdown(run).bytes_at_peak.sum() == want_peak


def test_a_process_groups_own_buffer_with_no_free_ends_after_its_transfer_on_a_cpu_trace(tmp_path):
    # gloo's reduce-scatter clones its input inside the c10d call and all-reduces the clone; gloo's worker thread
    # drops it when the transfer is done, and the CPU trace has no free. It ends at the first event after the
    # transfer's end, the worker having started it during the call or after the call returned. A functional
    # collective's output is the caller's tensor: it stays.
    def gloo(ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": ts,
                "dur": dur, "args": {}}

    a = _Alloc(0)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("c10d::_reduce_scatter_base_", 100, 10), _op("aten::clone", 102, 5), gloo(106, 94),
          _op("_c10d_functional::all_reduce", 300, 20), _op("aten::clone", 302, 5), _op("c10d::allreduce_", 308, 5),
          gloo(309, 50),
          _op("c10d::_reduce_scatter_base_", 500, 10), _op("aten::clone", 502, 5), gloo(520, 60)]
    a(103, 0x10, 1000)   # the clone: no free
    a(150, 0x20, 10)     # during the transfer: the clone still counts
    a(250, 0x30, 10)     # after it: the clone is off
    a(303, 0x40, 500)    # the functional all-reduce's output: the caller's
    a(400, 0x50, 10)
    a(503, 0x60, 2000)   # a clone whose transfer starts after the call returned
    a(550, 0x70, 10)
    a(600, 0x80, 10)     # after that transfer: off
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", ev + a.events, rank=0, world_size=1)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        tl = analyses.memory_timeline(run)
        assert tl.allocated_bytes.tolist() == [1000, 1010, 20, 520, 530, 2530, 2540, 550]
        assert tl.lost_free_bytes.tolist() == [0, 0, 1000, 1000, 1000, 1000, 1000, 3000]
        blocks = analyses.memory_blocks(run).set_index("bytes")
        assert blocks.loc[1000, "end_ts_ns"] == tl.ts_ns.iloc[2] and pd.isna(blocks.loc[500, "end_ts_ns"])
        assert blocks.loc[2000, "end_ts_ns"] == tl.ts_ns.iloc[7]
        assert blocks.loc[1000, "category"] == "communication_buffers"
        assert analyses.memory_peak(run).peak_allocated_bytes.tolist() == [2540]
        assert analyses.memory_breakdown(run).bytes_at_peak.sum() == 2540


def _gloo(ts, dur, name="gloo:all_gather"):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": dur, "args": {}}


def test_fsdps_gather_buffer_and_a_functional_output_whose_free_was_lost_end_after_their_transfer(tmp_path):
    # FSDP2 allocates its all-gather's output inside FSDP::all_gather, before the process group's call that gathers
    # into it; a functional all-reduce clones its input before its call. Where gloo's worker dropped either last,
    # the CPU trace has no free (or only a later allocation at its address): it ends at the first event after its
    # transfer. A functional output made in the trace's last step and never freed may be its caller's still.
    a = _Alloc(0)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
          _op("FSDP::all_gather (layers.0)", 100, 40, cat="user_annotation"), _op("aten::empty", 101, 2),
          _op("fsdp::all_gather_copy_in", 104, 10), _op("c10d::_allgather_base_", 120, 10), _gloo(125, 75),
          _op("_c10d_functional::all_reduce", 300, 20), _op("aten::clone", 302, 5), _op("c10d::allreduce_", 308, 5),
          _gloo(309, 41, "gloo:all_reduce"),
          _op("FSDP::all_gather (layers.1)", 500, 40, cat="user_annotation"), _op("aten::empty", 501, 2),
          _op("c10d::_allgather_base_", 520, 10), _gloo(525, 75),
          _op("_c10d_functional::all_reduce", 1300, 20), _op("aten::clone", 1302, 5), _op("c10d::allreduce_", 1308, 5),
          _gloo(1309, 41, "gloo:all_reduce")]
    a(102, 0x10, 1000)   # the all-gather's output: no free
    a(150, 0x20, 10)     # during its transfer: still counted
    a(210, 0x30, 10)     # after it: off
    a(303, 0x40, 500)    # a functional output in step 1 that outlives the step with no free: dropped by gloo
    a(400, 0x50, 10)     # after its transfer: off
    a(502, 0x60, 2000)   # an all-gather output whose address is allocated again long after its transfer
    a(620, 0x70, 10)     # after the transfer: off, not at the reuse
    a(900, 0x60, 30)     # the reuse
    a(1303, 0x80, 700)   # a functional output in the last step, never freed: the caller's
    a(1400, 0x90, 10)
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", ev + a.events, rank=0, world_size=1)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        tl = analyses.memory_timeline(run)
        assert tl.allocated_bytes.tolist() == [1000, 1010, 20, 520, 30, 2030, 40, 70, 770, 780]
        assert tl.lost_free_bytes.tolist() == [0, 0, 1000, 1000, 1500, 1500, 3500, 3500, 3500, 3500]
        blocks = analyses.memory_blocks(run).set_index("bytes")
        assert blocks.loc[1000, "end_ts_ns"] == tl.ts_ns.iloc[2] and blocks.loc[2000, "end_ts_ns"] == tl.ts_ns.iloc[6]
        assert blocks.loc[500, "end_ts_ns"] == tl.ts_ns.iloc[4] and pd.isna(blocks.loc[700, "end_ts_ns"])
        assert blocks.loc[1000, "category"] == "parameters"  # FSDP2's gathered parameters' buffer
        assert analyses.memory_peak(run).peak_allocated_bytes.tolist() == [2030]
        assert analyses.memory_breakdown(run).bytes_at_peak.sum() == 2030


def test_fsdps_unsharded_gradients_and_their_reduce_scatter_input_are_gradients_and_a_buffer(tmp_path):
    # FSDP2's backward makes each parameter's unsharded gradient (here in aten::mm), copies it into the
    # reduce-scatter's input inside FSDP::post_backward_reduce and drops it there; the input is freed once the
    # reduce-scatter is waited on, within the backward; the reduce-scatter's output, the sharded gradient, lives on.
    a = _Alloc(0)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("aten::linear", 50, 20),
          _op("autograd::engine::evaluate_function: AddmmBackward0", 100, 50), _op("AddmmBackward0", 101, 48),
          _op("aten::mm", 110, 20),
          _op("autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward", 190, 80),
          _op("FSDP::post_backward_reduce (layers.0)", 200, 60, cat="user_annotation"), _op("aten::empty", 201, 2),
          _op("c10d::_reduce_scatter_base_", 220, 10), _op("aten::empty", 240, 2),
          _op("FSDP::root_post_backward_callback", 295, 40, cat="user_annotation"),
          _op("FSDP::post_backward_rs_wait (layers.0)", 300, 20, cat="user_annotation"),
          _op("autograd::engine::evaluate_function: EmbeddingBackward0", 400, 50)]
    a(60, 0x10, 100)     # a forward activation, freed in the backward
    a(115, 0x20, 400)    # the unsharded gradient
    a(140, 0x10, -100)
    a(202, 0x30, 400)    # the reduce-scatter's input (the peak: 800)
    a(205, 0x20, -400)   # the unsharded gradient, dropped once copied in
    a(241, 0x40, 200)    # the sharded gradient: lives past the backward
    a(310, 0x30, -400)
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", ev + a.events, rank=0, world_size=1)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        bd = analyses.memory_breakdown(run).set_index("category").bytes_at_peak
        assert bd.to_dict() == {"parameters": 0, "gradients": 400, "optimizer_state": 0, "activations": 0,
                                "communication_buffers": 400, "other": 0}
        blocks = analyses.memory_blocks(run).set_index("bytes").category
        assert blocks[400].tolist() == ["gradients", "communication_buffers"] and blocks[200] == "gradients"


def test_a_pipelines_forward_inside_its_sends_annotation_and_fsdps_forward_function_are_the_forwards(tmp_path):
    # a pipeline stage's send: c10d::send returns at once, and gloo's annotation spans the transfer on the caller's
    # thread, over the next micro-batch's forward: what that forward allocates is activations, the call's own
    # buffer a communication buffer. FSDP2 applies RegisterPostBackwardFunction in every module's pre-forward: a
    # Function, not an autograd node; the backward starts at AddmmBackward0, and the linear run again under it is
    # the checkpoint's recompute (activations), which it was not when the backward seemed to start in the forward
    a = _Alloc(0)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("RegisterPostBackwardFunction", 20, 5),
          _op("aten::linear", 30, 20),
          _op("c10d::send", 60, 5), _op("gloo:send", 62, 200, cat="user_annotation"),  # on the caller's thread
          _op("Forward 1", 100, 50, cat="user_annotation"), _op("aten::linear", 110, 20),
          _op("autograd::engine::evaluate_function: AddmmBackward0", 300, 100), _op("AddmmBackward0", 301, 98),
          _op("aten::linear", 310, 30)]
    a(35, 0x10, 100)    # the first forward's linear: activations
    a(61, 0x20, 7)      # inside the send's call: a communication buffer (no free: gone after the transfer)
    a(115, 0x30, 1000)  # the next micro-batch's forward, inside the send's annotation: activations
    a(315, 0x40, 400)   # the recompute: activations (the peak)
    a(395, 0x40, -400)  # freed in the backward
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", ev + a.events, rank=0, world_size=1)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        blocks = analyses.memory_blocks(run).set_index("bytes").category
        assert blocks.to_dict() == {100: "activations", 7: "communication_buffers", 1000: "activations",
                                    400: "activations"}
        assert _by_category(analyses.memory_breakdown(run)) == {
            "parameters": 0, "gradients": 0, "optimizer_state": 0, "activations": 1500, "communication_buffers": 0,
            "other": 0}


def test_a_replicated_modules_pre_forward_copies_are_its_parameters(tmp_path):
    # replicate() (FSDP2's machinery on a one-rank shard group) copies each parameter into its unsharded storage in
    # FSDP::pre_forward, with no all-gather: the copies are parameters, not the forward's activations
    a = _Alloc(0)
    ev = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          _op("FSDP::pre_forward", 10, 40, cat="user_annotation"), _op("aten::copy_", 20, 5),
          _op("aten::linear", 60, 20),
          _op("autograd::engine::evaluate_function: AddmmBackward0", 300, 100), _op("AddmmBackward0", 301, 98)]
    a(15, 0x10, 512)    # the unsharded parameter, outside any operator of the pre-forward
    a(65, 0x20, 100)    # the forward's activation (the peak: 612)
    a(350, 0x20, -100)
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", ev + a.events, rank=0, world_size=1)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        assert _by_category(analyses.memory_breakdown(run)) == {
            "parameters": 512, "gradients": 0, "optimizer_state": 0, "activations": 100, "communication_buffers": 0,
            "other": 0}
