"""The analyses doctor's detectors cite (data_loading, sync_calls, small_kernels, compute_per_step,
backward_collectives), on a one-rank trace built here with known figures."""
from __future__ import annotations

import pytest

import tracekit

from .conftest import write_trace

US = 1000


def _x(cat, name, ts, dur, tid=7, pid=100, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": float(ts), "dur": float(dur), "args": args}


def _launched(name, launch_ts, ts, dur, corr):
    """A kernel on stream 7 and the cudaLaunchKernel that launched it (the kernel's step is the launch's)."""
    return [_x("cuda_runtime", "cudaLaunchKernel", launch_ts, 2, correlation=corr, cbid=211),
            _x("kernel", name, ts, dur, tid=7, pid=0, device=0, stream=7, correlation=corr)]


def _events():
    ev = [_x("user_annotation", "ProfilerStep#0", 0, 1000), _x("user_annotation", "ProfilerStep#1", 1000, 1000)]
    # data loading: an annotation with an operator inside it (counted once), and one that touches it
    ev += [_x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 50),
           _x("cpu_op", "aten::_next_data_helper", 20, 20),
           _x("user_annotation", "data_loading", 60, 20)]
    # syncs: the runtime calls count; the .item() around one does not
    ev += [_x("cpu_op", "aten::item", 95, 65), _x("cuda_runtime", "cudaStreamSynchronize", 100, 50),
           _x("cuda_runtime", "cudaDeviceSynchronize", 200, 10), _x("cuda_runtime", "cudaEventQuery", 220, 1)]
    # kernels launched in step 0: a 30 us GEMM, a 5 us one overlapping it, a 4 us one apart, and an NCCL kernel
    # (communication: not compute)
    ev += _launched("gemm_kernel", 230, 240, 30, 1) + _launched("elementwise_kernel", 232, 260, 5, 2)
    ev += _launched("vectorized_kernel", 234, 280, 4, 3)
    ev += _launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 236, 290, 100, 4)
    # step 1 (the last, left out of compute_per_step and backward_collectives): one more kernel
    ev += _launched("gemm_kernel", 1100, 1110, 30, 5)
    # the backward: two autograd nodes, the second issuing an all-reduce (not compute), then another all-reduce
    ev += [_x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 300, 100),
           _x("cpu_op", "autograd::engine::evaluate_function: AccumulateGrad", 400, 50),
           _x("cpu_op", "c10d::allreduce_", 420, 10),
           _x("cpu_op", "c10d::allreduce_", 500, 10)]
    return ev


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("doctor_analyses")
    write_trace(d / "trace" / "rank0.trace.json", _events(), rank=0)
    with tracekit.open(str(d / "trace"), store=str(d / "store")) as r:
        yield r


def test_data_loading_is_the_union_of_its_spans(run):
    df = run.analyze("data_loading")
    assert df.to_dict("records") == [{"rank": 0, "spans": 2, "data_loading_ns": 70 * US}]  # touching: apart


def test_sync_calls_are_the_runtime_calls_that_block(run):
    df = run.analyze("sync_calls")
    assert df.to_dict("records") == [{"rank": 0, "name": "cudaStreamSynchronize", "calls": 1, "total_ns": 50 * US},
                                     {"rank": 0, "name": "cudaDeviceSynchronize", "calls": 1, "total_ns": 10 * US}]


def test_small_kernels_under_the_threshold(run):
    row = run.analyze("small_kernels").iloc[0]
    assert (row.kernels, row.kernel_ns, row.small_kernels, row.small_kernel_ns) == (5, 169 * US, 2, 9 * US)
    assert row.small_pct == pytest.approx(40.0)
    assert run.analyze("small_kernels", max_ns=5 * US + 1).iloc[0].small_kernels == 2
    assert run.analyze("small_kernels", max_ns=4 * US + 1).iloc[0].small_kernels == 1


def test_compute_per_step_leaves_communication_and_the_last_step_out(run):
    df = run.analyze("compute_per_step")
    # 240-270 and 260-265 overlap (30 us), 280-284 apart (4 us); the NCCL kernel is not compute
    assert df.to_dict("records") == [{"rank": 0, "step": 0, "timeline": "gpu", "compute_ns": 34 * US}]


def test_backward_collectives_after_the_backward_compute(run):
    df = run.analyze("backward_collectives")
    # the backward's compute: 300 to 400 (the AccumulateGrad node issued the first all-reduce); both calls after
    assert df.to_dict("records") == [{"rank": 0, "step": 0, "gradient_calls": 2, "calls_after_backward": 2,
                                      "backward_ns": 100 * US, "gap_ns": 20 * US}]


def test_a_rank_the_trace_lacks_is_the_users_error(run):
    from tracekit.errors import TracekitError

    for name in ("data_loading", "sync_calls", "small_kernels", "compute_per_step", "backward_collectives"):
        with pytest.raises(TracekitError, match="--rank 3"):
            run.analyze(name, rank=3)
