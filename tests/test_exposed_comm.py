"""exposed_comm: golden values on tiny traces (GPU and gloo) computed by hand, agreement with
comm_comp_overlap(by_step=True) on real GPU traces, the slow-rank gloo sample, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import analyses
import tracekit
from tracekit.cli import cli

from .conftest import shared_trace_dir, write_trace
from .test_analyses import US, _gpu, _launch, _write, _x

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

# Two steps on one GPU rank (us after T0); GPU ops belong to the step of their launch.
#   step 1 [0, 100):   gemm_a [10, 30) stream 7, NCCL [20, 50) stream 20
#     comm 30, compute under it [20, 30) = 10 -> exposed 20 (66.67 % of comm, 20 % of the step)
#   step 2 [100, 200): NCCL [120, 160) stream 20, gemm_b [100, 130) and gemm_c [150, 155) stream 7
#     comm 40, compute under it [120, 130) + [150, 155) = 15 -> exposed 25 (62.5 %, 25 % of the step)
GPU_EVENTS = [
    _x("user_annotation", "ProfilerStep#1", 0, 100),
    _x("user_annotation", "ProfilerStep#2", 100, 100),
    _launch(1, 1, 2), _launch(2, 5, 2), _launch(3, 101, 2), _launch(4, 104, 2), _launch(5, 106, 2),
    _gpu(1, "gemm_a", 10, 20),
    _gpu(2, NCCL, 20, 30, stream=20),
    _gpu(3, "gemm_b", 100, 30),
    _gpu(4, NCCL, 120, 40, stream=20),
    _gpu(5, "gemm_c", 150, 5),
]

# One gloo rank, one step [0, 500) us. Main thread (tid 1):
#   DistributedDataParallel.forward annotation [0, 300)   annotation: not compute (a wait inside records nothing)
#   autograd node [95, 110) enclosing the call            encloses a call: not compute
#   c10d::allreduce_ [100, 105), aten::empty inside it    inside a call: not compute
#   aten::mm [110, 150)                                   compute
# gloo:all_reduce on the runloop thread (tid 2) [101, 200); aten::mm on another thread (tid 3) [150, 190): not
# the calling thread. comm = [100, 200) = 100, overlapped = [110, 150) = 40, exposed 60 (60 %, 12 % of 500).
GLOO_EVENTS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0.0, "dur": 500.0},
    {"ph": "X", "cat": "user_annotation", "name": "DistributedDataParallel.forward", "pid": 10, "tid": 1, "ts": 0.0,
     "dur": 300.0},
    {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AccumulateGrad", "pid": 10, "tid": 1,
     "ts": 95.0, "dur": 15.0},
    {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 10, "tid": 1, "ts": 100.0, "dur": 5.0,
     "args": {"Input Dims": [[[1000]], [], [], [], [], []],
              "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 10, "tid": 1, "ts": 101.0, "dur": 1.0},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 1, "ts": 110.0, "dur": 40.0},
    {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 10, "tid": 2, "ts": 101.0, "dur": 99.0,
     "args": {"Input Dims": [[1000]], "Input type": ["float"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 3, "ts": 150.0, "dur": 40.0},
]


@pytest.fixture(scope="module")
def gpu2(tmp_path_factory):
    d = tmp_path_factory.mktemp("exposed_gpu")
    run = tracekit.open(_write(d / "trace", GPU_EVENTS), store=str(d / "store"))
    yield run
    run.close()


@pytest.fixture(scope="module")
def gloo1(tmp_path_factory):
    d = tmp_path_factory.mktemp("exposed_gloo")
    write_trace(d / "trace" / "rank0.json", GLOO_EVENTS, rank=0, world_size=1, base_ns=10**18)
    run = tracekit.open(d / "trace", store=str(d / "store"))
    yield run
    run.close()


def _figures(df):
    return [(r.step, r.timeline, r.comm_count, r.comm_ns, r.overlapped_ns, r.exposed_comm_ns, r.step_ns)
            for r in df.itertuples()]


def test_gpu_by_hand(gpu2):
    df = analyses.exposed_comm(gpu2)
    assert list(df.columns)[:2] == ["rank", "step"] and set(df["rank"]) == {0}
    assert _figures(df) == [(1, "gpu", 1, 30 * US, 10 * US, 20 * US, 100 * US),
                            (2, "gpu", 1, 40 * US, 15 * US, 25 * US, 100 * US)]
    assert list(df.exposed_pct) == pytest.approx([100 * 20 / 30, 62.5])
    assert list(df.exposed_step_pct) == pytest.approx([20.0, 25.0])
    # the same figures as comm_comp_overlap per step: one shared definition
    o = analyses.comm_comp_overlap(gpu2, by_step=True)
    assert list(o.overlap_ns) == list(df.overlapped_ns) and list(o.exposed_comm_ns) == list(df.exposed_comm_ns)
    assert _figures(analyses.exposed_comm(gpu2, rank=0, step=2)) == [_figures(df)[1]]


def test_gloo_by_hand(gloo1):
    df = analyses.exposed_comm(gloo1)
    assert _figures(df) == [(1, "cpu", 1, 100 * US, 40 * US, 60 * US, 500 * US)]
    assert df.exposed_pct.iloc[0] == pytest.approx(60.0)
    assert df.exposed_step_pct.iloc[0] == pytest.approx(12.0)


def test_slow_rank_sample_ranks_0_and_2_wait(tmp_path):
    with tracekit.open(SAMPLES / "ddp3_slow_rank1", store=str(tmp_path / "s")) as run:
        df = analyses.exposed_comm(run)
    assert set(df.timeline) == {"cpu"} and set(df["rank"]) == {0, 1, 2}
    per_step = df.pivot(index="step", columns="rank", values="exposed_comm_ns")
    # rank 1 sleeps 40 ms per step before its all-reduce: ranks 0 and 2 sit in the collective waiting for it
    # (steps 2 and 3: 52 / 5.3 / 47 ms and 43 / 7.5 / 41 ms), rank 1's own all-reduce finishes in a few ms
    for step in (2, 3):
        row = per_step.loc[step]
        assert row[0] > 30e6 and row[2] > 30e6 and row[1] < 10e6, row
        assert min(row[0], row[2]) > 4 * row[1]
    total = df.groupby("rank").exposed_comm_ns.sum()
    assert total[0] > 3 * total[1] and total[2] > 3 * total[1]
    assert (df.exposed_comm_ns <= df.comm_ns).all() and (df.exposed_comm_ns + df.overlapped_ns == df.comm_ns).all()


@pytest.mark.slow  # shared traces
@pytest.mark.parametrize("rel", ["hta/trace_filter", "astra-sim/megatron_tp8"])
def test_gpu_agrees_with_comm_comp_overlap(rel, tmp_path):
    with tracekit.open(shared_trace_dir(rel), store=str(tmp_path / "s")) as run:
        e = analyses.exposed_comm(run)
        o = analyses.comm_comp_overlap(run, by_step=True)
    assert len(e) and set(e.timeline) == {"gpu"}
    key = ["rank", "step"]
    e, o = e.sort_values(key).reset_index(drop=True), o.sort_values(key).reset_index(drop=True)
    assert e[key].equals(o[key])
    assert list(e.comm_ns) == list(o.comm_ns) and list(e.overlapped_ns) == list(o.overlap_ns)
    assert list(e.exposed_comm_ns) == list(o.exposed_comm_ns)
    if rel == "hta/trace_filter":  # communication partly hidden there: the agreement is not 0 == 0
        assert (e.overlapped_ns > 0).all()
    else:  # TraceLens: exposed comm 241 ms on rank 0, 264 ms on rank 6
        total = e.groupby("rank").exposed_comm_ns.sum()
        assert total[0] == pytest.approx(241.2e6, rel=1e-3) and total[6] == pytest.approx(263.8e6, rel=1e-3)


def test_cli(gpu2):
    base = ["comms", "exposed", gpu2.trace_dir, "--store", gpu2.store.path]
    out = CliRunner().invoke(cli, [*base, "--step", "2", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [(r["rank"], r["step"], r["timeline"], r["exposed_comm_ns"], r["exposed_pct"]) for r in rows] == [
        (0, 2, "gpu", 25 * US, 62.5)]
    for args, needle in ((["--rank", "3"], "--rank 3"), (["--step", "9"], "--step 9")):
        out = CliRunner().invoke(cli, [*base, *args])
        assert out.exit_code == 2 and out.output.count("\n") == 1 and needle in out.output, out.output
    out = CliRunner().invoke(cli, ["comms", "exposed", "--help"])
    lines = [line.strip() for line in out.output.splitlines()]
    # \b kept the example lines apart (click would otherwise rewrap them into one paragraph)
    assert out.exit_code == 0 and "Example:" in lines
    assert "tracekit comms exposed runs/job42/ --rank 0 --step 3" in lines
