"""[hardware]: the run re-timed for another GPU by each op's roofline position (replay/hardware.py).

The traces are built in code: one A100 rank per step running a compute-bound fp16 GEMM, a memory-bound
fp32 add, an fp32 GEMM whose kernel is TF32 by name, a kernel no op of the FLOP table launched, a host
copy and a sync; every expected duration below is the docs' formula applied by hand to the catalog's
figures."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from analyses.devices import catalog
from replay.replayer import replay
from replay.scenario import ScenarioError, load_scenario
from tracekit.cli import cli

from .conftest import write_trace

N = 4096
GEMM_US, TF32_US, ADD_US, CUSTOM_US, COPY_US = 5000.0, 3000.0, 40.0, 100.0, 30.0
ADD_DIMS = [[1024, 1024], [1024, 1024]]


def _events(steps=3, cpu_gap_us=0.0, device="NVIDIA A100-SXM4-80GB"):
    ev, t, corr = [], 0.0, 0
    gpu_us = GEMM_US + TF32_US + ADD_US + CUSTOM_US + COPY_US
    for s in range(1, steps + 1):
        step_us = gpu_us + 500.0 + cpu_gap_us
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t,
                   "dur": step_us})
        k = t + 300.0  # the GPU stream runs the kernels back to back from here
        ops = [("aten::mm", [[N, N], [N, N]], ["c10::Half", "c10::Half"], "sm80_xmma_gemm_f16f16_f16f32", GEMM_US),
               ("aten::mm", [[N, N], [N, N]], ["float", "float"], "sm80_xmma_gemm_tf32f32_tf32f32_f32", TF32_US),
               ("aten::add", ADD_DIMS, ["float", "float"], "vectorized_elementwise_kernel", ADD_US),
               (None, None, None, "my_custom_kernel", CUSTOM_US)]
        c = t + 10.0
        for name, dims, types, kname, dur in ops:
            corr += 1
            if name is not None:
                ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": c, "dur": 40.0,
                           "args": {"Input Dims": dims, "Input type": types, "External id": corr}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": c + 10, "dur": 20.0, "args": {"correlation": corr, "External id": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": k, "dur": dur,
                       "args": {"correlation": corr, "device": 0, "stream": 7, "External id": corr}})
            c += 50.0
            k += dur
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": c,
                   "dur": 10.0, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                   "ts": k, "dur": COPY_US, "args": {"correlation": corr, "device": 0, "stream": 7, "bytes": 1 << 20}})
        k += COPY_US
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                   "ts": c + 20, "dur": k - (c + 20) + 5, "args": {"correlation": corr}})
        t += step_us
    return ev


def _trace(path, **kw):
    device = kw.pop("device", "NVIDIA A100-SXM4-80GB")
    write_trace(path / "rank0.trace.json", _events(device=device, **kw), rank=0, world_size=1,
                extra={"deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 85174583296}]})
    return path


def _scenario(tmp_path, body: str, name="hw"):
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return p


def _durations(res):
    g = res.graph
    nodes = g.nodes()
    out = {}
    for i in np.flatnonzero(nodes.kind.to_numpy(object) == "gpu"):
        out.setdefault(nodes.name[i], []).append((int(g.dur_ns[i]), int(res.end_ns[i] - res.start_ns[i])))
    return out


def _device(name):
    return next(d for d in catalog() if d.name == name)


def _roofline_s(flops, nbytes, dev, dtype):
    return max(flops / (dev.peak(dtype) * 1e12), nbytes / (dev.memory_gbps * 1e9))


def _expected(old, new):
    """Each kernel's duration multiplier by the docs' formula, by hand."""
    gemm_f, gemm_b = 2 * N ** 3, 3 * N * N * 2  # two fp16 inputs read and the output written
    tf32_b = 3 * N * N * 4
    add_b = 3 * 1024 * 1024 * 4  # two inputs and an output the size of the largest
    return {"sm80_xmma_gemm_f16f16_f16f32": _roofline_s(gemm_f, gemm_b, new, "fp16") / _roofline_s(gemm_f, gemm_b, old, "fp16"),
            "sm80_xmma_gemm_tf32f32_tf32f32_f32": _roofline_s(gemm_f, tf32_b, new, "tf32") / _roofline_s(gemm_f, tf32_b, old, "tf32"),
            "vectorized_elementwise_kernel": old.memory_gbps / new.memory_gbps,
            "my_custom_kernel": old.memory_gbps / new.memory_gbps,  # no FLOP count: the bandwidth ratio
            "Memcpy HtoD (Pageable -> Device)": 1.0}  # the host link: unchanged


def test_every_gpu_op_follows_its_roofline_position_on_the_new_gpu(tmp_path):
    run = _trace(tmp_path / "t")
    res = replay(run, load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "H100-SXM"\n')))
    want = _expected(_device("A100-SXM4-80GB"), _device("H100-SXM"))
    got = _durations(res)
    assert set(got) == set(want)
    for name, pairs in got.items():
        for measured, replayed in pairs:
            assert replayed == int(np.rint(measured * want[name])), name
    assert want["sm80_xmma_gemm_f16f16_f16f32"] == pytest.approx(312.0 / 989.5)  # compute-bound on both
    assert any("A100-SXM4-80GB -> H100-SXM" in n for n in res.notes)
    # the GPU sets the pace of this step: it follows the kernels, and no launch-bound note
    s = res.summary().iloc[0]
    gpu_old = sum(m for v in got.values() for m, _ in v) / 3
    gpu_new = sum(r for v in got.values() for _, r in v) / 3
    assert s.measured_step_ns - s.predicted_step_ns == pytest.approx(gpu_old - gpu_new, rel=0.02)
    assert not any("launch-bound" in n for n in res.notes)


def test_the_figures_given_override_the_device_and_a_slower_gpu_slows_the_step(tmp_path):
    run = _trace(tmp_path / "t")
    sc = load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "A100-SXM4-80GB"\nfp16_tflops = 100.0\n'
                                           'tf32_tflops = 50.0\nmemory_gbps = 4000.0\n'))
    res = replay(run, sc)
    old = _device("A100-SXM4-80GB")
    new = type(old)("x", "", {**old.peaks_tflops, "fp16": 100.0, "tf32": 50.0}, 4000.0, "")
    want = _expected(old, new)
    for name, pairs in _durations(res).items():
        for measured, replayed in pairs:
            assert replayed == int(np.rint(measured * want[name])), name
    assert res.summary().predicted_step_ns.iloc[0] > res.summary().measured_step_ns.iloc[0]


def test_the_same_gpu_changes_nothing_bit_for_bit(tmp_path):
    run = _trace(tmp_path / "t")
    base = replay(run)
    same = replay(run, load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "A100-SXM4-80GB"\n')))
    assert (same.start_ns == base.start_ns).all() and (same.end_ns == base.end_ns).all()


def test_a_launch_bound_step_does_not_speed_up_and_the_output_says_so(tmp_path):
    run = _trace(tmp_path / "t", cpu_gap_us=60_000.0)  # the host works 60 ms a step after the GPU is done
    res = CliRunner().invoke(cli, ["whatif", str(run), str(_scenario(tmp_path, '[hardware]\ngpu = "B200"\n')),
                                   "--store", str(tmp_path / "st"), "--format", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[-1]
    # the kernels take ~0.17 of their time on a B200, but they were 8 ms of a 68 ms step: ~10% saved
    assert -15 < row["change_pct"] < -5
    assert "a launch-bound step does not speed up" in res.output


def test_unknown_run_device_needs_from_gpu(tmp_path):
    run = _trace(tmp_path / "t", device="Mystery Accelerator 9000")
    sc = load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "H100-SXM"\n'))
    with pytest.raises(ScenarioError, match=r"\[hardware\] from_gpu: rank 0: its device 'Mystery Accelerator 9000' "
                                            r"is not in the device catalog"):
        replay(run, sc)
    sc = load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "H100-SXM"\nfrom_gpu = "a100-sxm4-80gb"\n', "b"))
    want = _expected(_device("A100-SXM4-80GB"), _device("H100-SXM"))
    for name, pairs in _durations(replay(run, sc)).items():
        assert all(r == int(np.rint(m * want[name])) for m, r in pairs)


def test_a_cpu_run_is_told_nothing_changes(tmp_path):
    sc = load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "H100-SXM"\n'))
    run = tmp_path / "cpu"
    write_trace(run / "rank0.trace.json", [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
         "args": {"Input Dims": [[4, 4], [4, 4]], "Input type": ["float", "float"]}}])
    res = replay(run, sc)
    assert any("[hardware] changes nothing: the run has no GPU ops" in n for n in res.notes)


@pytest.mark.parametrize("body, key, allowed", [
    ('gpu = "H900"', "[hardware] gpu", "'H900' is not in the device catalog; allowed: V100-SXM2"),
    ('gpu = "H100-SXM"\nfrom_gpu = "K80"', "[hardware] from_gpu", "'K80' is not in the device catalog"),
    ('gpu = "H100-SXM"\nbf16_tflops = -1', "[hardware] bf16_tflops", "must be a number > 0"),
    ('gpu = "H100-SXM"\nflops = 3', "[hardware] flops", "unknown key; allowed: gpu, from_gpu, catalog"),
    ('gpu = "H100-SXM"\ncatalog = "nope.toml"', "[hardware] catalog", "cannot read the device catalog"),
])
def test_bad_hardware_keys_are_one_line_naming_the_key(tmp_path, tiny_dir, body, key, allowed):
    p = _scenario(tmp_path, "[hardware]\n" + body + "\n")
    res = CliRunner().invoke(cli, ["whatif", str(tiny_dir), str(p), "--store", str(tmp_path / "st")])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and "Traceback" not in res.output
    assert key in res.output and allowed in res.output


def test_a_dtype_the_new_gpu_has_no_peak_for_is_an_error_naming_the_key(tmp_path):
    run = _trace(tmp_path / "t")
    res = CliRunner().invoke(cli, ["whatif", str(run), str(_scenario(tmp_path, "[hardware]\nmemory_gbps = 3000.0\n")),
                                   "--store", str(tmp_path / "st")])
    assert res.exit_code == 2, res.output
    assert "[hardware] gpu:" in res.output and "no fp16 peak" in res.output and "give [hardware] fp16_tflops" in res.output


def test_a_users_catalog_adds_the_new_gpu(tmp_path):
    (tmp_path / "ours.toml").write_text('[devices.X1]\nmatch = "X1"\nfp16 = 624.0\ntf32 = 312.0\n'
                                        'memory_gbps = 4078.0\nsource = "our datasheet"\n')
    run = _trace(tmp_path / "t")
    sc = load_scenario(_scenario(tmp_path, '[hardware]\ngpu = "X1"\ncatalog = "ours.toml"\n'))
    res = replay(run, sc)
    gemm = _durations(res)["sm80_xmma_gemm_f16f16_f16f32"]
    assert all(r == int(np.rint(m * 312.0 / 624.0)) for m, r in gemm)
