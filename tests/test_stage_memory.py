"""A pipeline stage's memory over its micro-batch schedule (replay/activations.py): the schedules, the walk over
them with exact bytes, and a re-layout's peak between a run without a pipeline and one with, both recorded."""
from __future__ import annotations

import pandas as pd
import pytest

import tracekit
from replay.activations import schedule, stage_peak
from replay.scenario import scenario_from_dict
from replay.whatif import whatif


def test_the_schedules_run_each_micro_batch_forward_then_backward():
    assert schedule(1, 0, 1, "gpipe") == ["F", "B"]
    assert schedule(1, 0, 2, "1f1b") == ["F", "B", "F", "B"]  # gradient accumulation
    assert schedule(2, 0, 4, "gpipe") == ["F"] * 4 + ["B"] * 4
    # 1F1B: pp - stage - 1 warm-up forwards, then a forward and a backward each
    assert schedule(2, 0, 4, "1f1b") == ["F", "F", "B", "F", "B", "F", "B", "B"]
    assert schedule(2, 1, 4, "1f1b") == ["F", "B"] * 4
    assert schedule(4, 0, 2, "1f1b") == ["F", "F", "B", "B"]  # fewer micro-batches than the warm-up wants
    for pp, m, kind in ((2, 4, "gpipe"), (4, 8, "1f1b"), (3, 2, "1f1b")):
        for s in range(pp):
            ops = schedule(pp, s, m, kind)
            assert ops.count("F") == ops.count("B") == m
            live = 0
            for op in ops:  # a micro-batch's backward never comes before its forward
                live += 1 if op == "F" else -1
                assert live >= 0


def test_a_stage_peaks_where_its_kept_micro_batches_and_gradients_add_up():
    # a micro-batch keeps 10 bytes, the forward's transient 1, the backward's 2, the stage's gradients 5
    # GPipe, 2 micro-batches: F 11, F 21; the first B 22 at its start (20 + 2) and 17 at its end (10 + 5 + 2);
    # the second B 17
    assert stage_peak(["F", "F", "B", "B"], 10, 1, 2, 5) == 22
    # 1F1B's first stage of 2 with 3 micro-batches: F F B F B B; the forward after the first backward holds two
    # micro-batches and the gradients: 20 + 1 + 5 = 26, the backward after it 20 + 2 + 5 = 27
    assert stage_peak(schedule(2, 0, 3, "1f1b"), 10, 1, 2, 5) == 27
    # the last stage's one in flight at a time: F 11, B 12 / 7, F 16, B 17, F 16, B 17
    assert stage_peak(schedule(2, 1, 3, "1f1b"), 10, 1, 2, 5) == 17
    # gradients larger than a micro-batch: the first backward's end is the peak
    assert stage_peak(["F", "B"], 10, 0, 0, 50) == 50
    # more micro-batches in flight never hold less
    assert stage_peak(schedule(2, 0, 4, "gpipe"), 10, 1, 2, 5) >= stage_peak(schedule(2, 0, 4, "1f1b"), 10, 1, 2, 5)


def test_a_backward_peaks_over_what_it_keeps_net_of_what_it_has_freed():
    # the backward's transient 8 on top of the whole micro-batch's 10 held would be 18; freeing 5 of the 10 (the
    # head's logits) before the transient peaks holds 13: the walk takes the backward's fullest over its kept
    assert stage_peak(["F", "B"], 10, 0, 8, 0) == 18
    assert stage_peak(["F", "B"], 10, 0, 8, 0, over_kept=3) == 13
    # the first backward's end (its micro-batch freed, the gradients full) takes the transient itself
    assert stage_peak(["F", "B"], 10, 0, 8, 6, over_kept=3) == 14


def test_the_first_backward_peaks_where_its_gradients_and_transient_add_up_not_at_its_end():
    from replay.activations import stage_peaks

    # a micro-batch keeps 10, the gradients are 20, the backward's largest transient 8 (at the loss): at its end the
    # walk took 20 + 8 = 28. The run's first backward shows the transient at 5 when 40% of the gradients are made
    # and at 1 at its end; a block's backward frees what it kept as it makes its gradients: 6 + 8 + 5 and 20 + 1
    curve = [[0.4, 5.0], [1.0, 1.0]]
    assert stage_peaks(["F", "B"], 10, 0, 8, 20)[2] == 28
    assert stage_peaks(["F", "B"], 10, 0, 8, 20, first_backward=curve)[2] == 21
    # gradients of 5: the middle holds the most (6 + 2 + 5)
    assert stage_peaks(["F", "B"], 10, 0, 8, 5, first_backward=curve)[2] == 13
    # the last stage's head (4 of the 10: its logits) is freed by the loss's backward; what it retains (3) stays:
    # 3 + 6 x 0.6 + 2 + 5
    assert stage_peaks(["F", "B"], 10, 0, 8, 5, retained=3, head=4, first_backward=curve)[2] == pytest.approx(13.6)
    # a second micro-batch in flight (GPipe) is held throughout: + 10
    assert stage_peaks(["F", "F", "B", "B"], 10, 0, 8, 20, first_backward=curve)[2] == 31


def test_the_first_backward_is_measured_until_its_gradients_are_made():
    import numpy as np

    # the backward allocates 150 B at 210 (to 230) and 180 at 225 (to 235), and the gradients 50 B at 215 and 50 at
    # 240: the curve ends at 240, where they are made. Its start (210), before any gradient, is the backward's
    # start, which the walk takes apart
    p = _two_blocks_and_a_backward()
    grads = pd.DataFrame({"alloc_ts_ns": [215, 240], "end_ts_ns": pd.array([None, None], "Int64"),
                          "bytes": [50, 50]})
    got = p.first_backward(grads)
    want = [[0.5, 150], [0.5, 330], [0.5, 180], [0.5, 0], [1, 0]]
    assert got.tolist() == want
    # a backward that makes no gradients shows nothing
    assert p.first_backward(grads.iloc[:0]).shape == (0, 2)
    # in a step (0-1000) whose optimizer frees the gradients at 500, the backward ends with its last node (244); a
    # transient 30 B gradient at 241-243 (a later micro-batch's, added to the first's) does not move where they are
    # made
    p.step_ts, p.step_end, p.bwd_ends = np.array([0]), np.array([1000]), np.array([100, 244])
    grads = pd.DataFrame({"alloc_ts_ns": [215, 240, 241], "end_ts_ns": [500, 500, 243], "bytes": [50, 50, 30]})
    assert p.first_backward(grads).tolist() == want


def test_a_pipelines_last_stage_holds_each_micro_batchs_output_until_the_step_ends():
    # torch.distributed.pipelining's last stage keeps every micro-batch's output to merge them (the memory runs'
    # 1F1B batch 16 last stage held four 512 KiB logits at its peak): 3 of a micro-batch's 10 stay after its
    # backward. 1F1B's last stage, 2 micro-batches, gradients 1: F 10, B 12, the first's end 3 + 1 + 2, F 14, B 16
    ops = schedule(2, 1, 2, "1f1b")
    assert stage_peak(ops, 10, 0, 2, 1) == 13
    assert stage_peak(ops, 10, 0, 2, 1, retained=3) == 16
    from replay.activations import stage_peaks

    assert stage_peaks(ops, 10, 0, 2, 1, retained=3) == (16, 16, 6)


def test_the_models_output_per_token_is_the_losss_input(tmp_path):
    from replay import relayout

    from .conftest import REPO

    # the bundled DDP sample's cross-entropy reads 256 tokens' logits over a 512-word vocabulary, fp32
    with tracekit.open(str(REPO / "sample_traces" / "memory" / "ddp_ckpt_none"), store=str(tmp_path / "s")) as run:
        assert relayout._output_per_token(run, {}) == 512 * 4


def _two_blocks_and_a_backward():
    """One rank's allocations placed (replay.activations._Placed): two forward blocks (0-50, 100-150); kept for the
    backward, 100 B allocated at 10 (freed at 300) and 200 B at 160 (freed at 220); the backward allocates 150 B at
    210 (to 230) and 180 at 225 (to 235)."""
    import numpy as np

    from replay.activations import _Placed
    from replay.memory import BACKWARD, FORWARD

    ts = np.array([10, 160, 210, 225], np.int64)
    end = np.array([300, 220, 230, 235], np.float64)
    phase = np.array([FORWARD, FORWARD, BACKWARD, BACKWARD], np.int8)
    keeps = np.array([True, True, False, False])
    return _Placed(np.array([0, 100], np.int64), np.array([50, 150], np.int64), ts, end,
                   np.array([100.0, 200.0, 150.0, 180.0]), np.array(["activations"] * 4, object), phase, keeps.copy(),
                   keeps)


def test_the_backward_over_kept_is_measured_net_of_the_kept_bytes_it_frees():
    import numpy as np

    from replay.activations import _Placed
    from replay.memory import BACKWARD, FORWARD

    # two forward blocks (0-50, 100-150); kept: 100 B in the first block (freed at 300), 200 B after the second
    # (the head's, freed at 220 by the backward); the backward allocates 150 B at 210 (to 230) and 180 at 225 (to
    # 235): 450 live at 210 over 300 kept when it began -> 150; its transient alone is 330 (at 225)
    p = _two_blocks_and_a_backward()
    got = p.kept()
    assert got[4] == 330.0 and got[5] == 150.0
    # two backward stretches (a 1F1B stage's: a forward block between them) are each measured from their start
    ts2 = np.append(p.ts, [420, 430, 440])
    end2 = np.append(p.end, [500, 445, 450])
    p2 = _Placed(np.array([0, 100, 400], np.int64), np.array([50, 150, 410], np.int64), ts2, end2,
                 np.append(p.nbytes, [40.0, 500.0, 30.0]), np.array(["activations"] * 7, object),
                 np.append(p.phase, [FORWARD, BACKWARD, BACKWARD]).astype(np.int8),
                 np.append(p.keeps, [True, False, False]), np.append(p.keeps, [True, False, False]))
    assert p2._over_kept(p2.phase == BACKWARD) == 530.0  # 40 kept, then 500 + 30 on top


@pytest.fixture(scope="module")
def pipeline_pair(tmp_path_factory):
    """The small transformer recorded with [memory] events on 2 ranks as DDP and as a GPipe pipeline (4
    micro-batches), at the same global batch."""
    pytest.importorskip("torch")
    from tracekit.capture import layouts

    base = tmp_path_factory.mktemp("stage_memory")
    out = {}
    for layout in ("ddp", "pp_gpipe"):
        cfg = layouts.LayoutConfig(out_dir=str(base / layout), layout=layout, ranks=2, steps=4, warmup=2,
                                   timed_steps=1, profile_memory=True, layers=4, batch_size=8)
        layouts.run(cfg)
        out[layout] = tracekit.open(cfg.out_dir, store=str(base / f"{layout}.store"))
    yield out
    for r in out.values():
        r.close()


PAR = {"ddp": {"dp": 2, "tp": 1, "pp": 1, "micro_batches": 1, "sharding": "none"},
       "pp_gpipe": {"dp": 1, "tp": 1, "pp": 2, "micro_batches": 4, "schedule": "gpipe", "sharding": "none"}}


@pytest.mark.slow  # two real 2-rank gloo training jobs
@pytest.mark.parametrize("src,dst", [("ddp", "pp_gpipe"), ("pp_gpipe", "ddp")])
def test_a_pipelines_peak_from_a_run_without_one_and_back(pipeline_pair, src, dst):
    # DDP holds one micro-batch of the whole model and peaks at the loss; a GPipe stage holds 4 micro-batches of
    # half the blocks, the last with the head, and its gradients from the first backward on (before the schedule
    # walk, the run's own curve re-sized: -12% and +27% on one recording)
    t = whatif(pipeline_pair[src], [scenario_from_dict({"name": "x", "parallelism": PAR[dst]}, "x")])
    t = t.set_index("scenario")
    measured = whatif(pipeline_pair[dst], []).iloc[0].measured_peak_alloc_bytes
    assert abs(t.loc["x", "predicted_peak_alloc_bytes"] / measured - 1) <= 0.10
    # the run's own layout, asked for, is its measured peak
    same = whatif(pipeline_pair[src], [scenario_from_dict({"name": "y", "parallelism": PAR[src]}, "y")])
    same = same.set_index("scenario")
    assert same.loc["y", "predicted_peak_alloc_bytes"] == same.loc["measured", "measured_peak_alloc_bytes"]


@pytest.mark.slow  # two real 2-rank gloo training jobs
def test_a_layout_without_a_pipeline_holds_its_output_as_the_pipeline_did(pipeline_pair):
    # pipelining's last stage holds each micro-batch's output until the step ends; the recorded loop without a
    # pipeline (`logits = model(x)`) holds its one output as long, past its backward into the optimizer: a re-layout
    # of the pipeline run without a pipeline keeps it (before, its blocks' backward had the head's bytes freed:
    # pipeline -> FSDP x TP with checkpointing -22% on the memory runs)
    import analyses
    import replay
    from replay import relayout

    ddp, gpipe = pipeline_pair["ddp"], pipeline_pair["pp_gpipe"]
    per_token = relayout._output_per_token(gpipe, {})
    assert per_token == 512 * 4  # the vocabulary, fp32
    b = analyses.memory_blocks(ddp)
    opt = ddp.sql("SELECT rank, min(ts_ns) AS t FROM events WHERE starts_with(name, 'Optimizer.step') GROUP BY rank")
    b = b.merge(opt, on="rank")
    logits = b[(b.bytes == per_token * 8 * 64 // 2) & (b.alloc_ts_ns < b.t) & (b.end_ts_ns > b.t)]
    assert set(logits["rank"]) == {0, 1}
    plan = replay.run(gpipe, scenario_from_dict({"name": "x", "parallelism": PAR["ddp"]}, "x")).info.relayout
    assert plan.retained == per_token
