"""Compute duration model (replay/compute.py): identity is exact, speedups divide, rank slowdowns
multiply compute only, CPU scale, first matching rule wins, rounding half to even."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.compute import ComputeModel, Speedup


def nodes(rows) -> pd.DataFrame:
    cols = ["rank", "kind", "name", "stream", "gpu_kind", "kernel_class", "dur_ns"]
    df = pd.DataFrame(rows, columns=cols)
    df.insert(0, "node_id", np.arange(len(df), dtype=np.int64))
    df["rank"] = df["rank"].astype("int64")
    df["stream"] = df["stream"].astype("Int64")
    df["dur_ns"] = df["dur_ns"].astype("int64")
    return df


N = nodes([
    (0, "cpu", "aten::linear", None, None, None, 1000),
    (0, "runtime", "cudaLaunchKernel", None, None, None, 10),
    (0, "gpu", "sm90_xmma_gemm_bf16", 7, "kernel", "compute", 4000),
    (0, "gpu", "flash_fwd_kernel", 7, "kernel", "compute", 3001),
    (0, "gpu", "Memcpy HtoD", 7, "memcpy", "memory", 500),
    (0, "gpu", "ncclDevKernel_AllReduce", 20, "kernel", "communication", 9000),
    (0, "comm", "all_reduce", None, None, None, 9000),
    (0, "sync", "cudaStreamSynchronize", None, None, None, 777),
    (1, "gpu", "sm90_xmma_gemm_bf16", 7, "kernel", "compute", 4000),
    (1, "cpu", "aten::linear", None, None, None, 1000),
    (1, "barrier", "barrier", None, None, None, 50),
])


def test_identity_is_bit_identical():
    assert ComputeModel().node_durations(N, np.random.default_rng(0)).tolist() == N["dur_ns"].tolist()
    assert ComputeModel(speedups=[{"name": "nothing_matches", "factor": 3.0}]).node_durations(N).tolist() == N["dur_ns"].tolist()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2 ** 62), min_size=1, max_size=20))
def test_identity_exact_even_beyond_float_precision(durs):
    df = nodes([(0, "gpu", "k", 7, "kernel", "compute", d) for d in durs])
    got = ComputeModel(rank_slowdown={5: 2.0}).node_durations(df)  # rank 5 absent: nothing touched
    assert got.dtype == np.int64 and got.tolist() == durs


def test_speedup_by_class_and_name_first_rule_wins():
    m = ComputeModel(speedups=[{"name": "gemm", "factor": 4.0}, {"kernel_class": "compute", "factor": 2.0},
                               {"kernel_class": "memory", "factor": 5.0}])
    got = m.node_durations(N)
    assert got[2] == 1000 and got[8] == 1000   # gemm: first rule only (not 4 x 2)
    assert got[3] == 1500                       # 3001 / 2 = 1500.5 -> round half to even
    assert got[4] == 100
    assert got[5] == 9000 and got[6] == 9000    # communication kernels and comm transfers untouched
    assert got[0] == 1000 and got[1] == 10 and got[7] == 777


def test_missing_values_in_string_columns():
    df = N.copy()
    df["kernel_class"] = df["kernel_class"].astype("string")  # pd.NA where missing
    df.loc[0, "name"] = None
    got = ComputeModel(speedups=[{"kernel_class": "compute", "factor": 2.0}, {"name": "aten", "factor": 9.0}],
                       cpu_scale=2.0).node_durations(df)
    assert got[2] == 2000 and got[0] == 500


def test_class_and_name_together_must_both_match():
    got = ComputeModel(speedups=[Speedup(factor=2.0, kernel_class="memory", name="gemm")]).node_durations(N)
    assert got.tolist() == N["dur_ns"].tolist()


def test_rank_slowdown_multiplies_compute_of_that_rank_only():
    got = ComputeModel(rank_slowdown={1: 1.5}).node_durations(N)
    assert got[8] == 6000 and got[9] == 1500   # rank 1 GPU op and CPU op
    assert got[10] == 50                        # barrier is not compute
    assert got[:8].tolist() == N["dur_ns"][:8].tolist()


def test_cpu_scale_speeds_up_the_host_side():
    got = ComputeModel(cpu_scale=2.0).node_durations(N)
    assert got[0] == 500 and got[1] == 5 and got[9] == 500
    assert got[2] == 4000 and got[7] == 777  # GPU and sync untouched


def test_combined_rounding_half_even():
    df = nodes([(0, "gpu", "k", 7, "kernel", "compute", d) for d in (1, 3, 5, 7)])
    got = ComputeModel(speedups=[{"kernel_class": "compute", "factor": 2.0}]).node_durations(df)
    assert got.tolist() == [0, 2, 2, 4]  # 0.5, 1.5, 2.5, 3.5 -> even


@pytest.mark.parametrize("kw", [dict(cpu_scale=0), dict(rank_slowdown={0: -1.0}),
                                dict(speedups=[{"kernel_class": "gpu", "factor": 2}]),
                                dict(speedups=[{"name": "(", "factor": 2}]),
                                dict(speedups=[{"factor": 2}]), dict(speedups=[{"name": "x", "factor": float("nan")}])])
def test_invalid_parameters(kw):
    with pytest.raises(Exception):
        ComputeModel(**kw)
