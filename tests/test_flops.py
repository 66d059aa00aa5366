"""FLOPs per training step from the trace's shapes against torch's FlopCounterMode, on models trained under
the profiler on CPU; the device catalog; MFU and roofline on a real GPU trace."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tracekit
from analyses import devices
from tracekit.cli import cli

from .conftest import shared_trace_dir

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm"}
CONV_OPS = {"convolution", "_convolution", "convolution_backward"}


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.qkv, self.out = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.n1, self.att, self.n2 = nn.LayerNorm(d), Attention(d, h), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.att(self.n1(x))
        return x + self.mlp(self.n2(x))


def transformer():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block()), lambda: torch.randn(4, 16, 32)


def convnet():
    torch.manual_seed(0)
    return (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                          nn.ReLU(), nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=2), nn.Flatten(),
                          nn.Linear(16 * 8 * 8, 10)), lambda: torch.randn(4, 3, 16, 16))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8)), \
        lambda: torch.randn(16, 64)


def _step(model, opt, x):
    opt.zero_grad()
    model(x).float().pow(2).mean().backward()
    opt.step()


def _record(make, tmp_path):
    """Train one step under the profiler (the trace) and one step under FlopCounterMode (the oracle)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    model, data = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = data()
    _step(model, opt, x)  # warm-up: the optimizer's state exists in both measured steps
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(model, opt, x)
    d = tmp_path / "trace"
    d.mkdir()
    prof.export_chrome_trace(str(d / "rank0.trace.json"))
    fc = FlopCounterMode(display=False)
    with fc:
        _step(model, opt, x)
    oracle = {"gemm": 0, "conv": 0, "attention": 0}
    for op, n in fc.get_flop_counts()["Global"].items():
        name = str(op).split(".")[1] if "." in str(op) else str(op)
        if name in GEMM_OPS:
            oracle["gemm"] += n
        elif name in CONV_OPS:
            oracle["conv"] += n
        elif "attention" in name:
            oracle["attention"] += n
    run = tracekit.open(str(d), store=str(tmp_path / "store"))
    return run, oracle, model, x


def _by_class(run):
    df = run.analyze("flops_by_op")
    return {c: int(df[df.op_class == c].flops.fillna(0).sum()) for c in ("gemm", "conv", "attention")}, df


@pytest.mark.slow  # trains three models under the profiler
@pytest.mark.parametrize("make", [transformer, convnet, mlp])
def test_flops_per_step_equal_flopcountermode_per_class(make, tmp_path):
    run, oracle, model, x = _record(make, tmp_path)
    mine, df = _by_class(run)
    for c in ("gemm", "conv"):
        assert mine[c] == pytest.approx(oracle[c], rel=0.01), (c, mine, oracle)
    assert oracle["gemm"] > 0
    if make is convnet:
        assert oracle["conv"] > 0
    # nothing counted twice: aten::linear and aten::matmul leave the count to their GEMM children
    assert not {"aten::linear", "aten::matmul", "aten::convolution"} & set(df[df.flops.fillna(0) > 0].name)
    if make is transformer:
        # FlopCounterMode has no formula for the CPU attention kernels (0): the GPU variants' formula by hand,
        # forward 2 GEMMs and backward 5, per block: b=4, h=4, s=16, d_head=8
        assert oracle["attention"] == 0
        b, h, s, dh = 4, 4, 16, 8
        by_hand = 2 * (2 * b * h * s * s * dh * 2 + 2 * b * h * s * s * dh * 5)
        assert mine["attention"] == by_hand
        names = set(df[df.op_class == "attention"].name)
        assert names == {"aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
    # a CPU run: no peak, a note saying so, the FLOPs still given
    m = run.analyze("mfu")
    assert m.flops.iloc[0] == sum(mine.values()) and m.mfu_pct.isna().all()
    assert "CPU run" in m.attrs["note"]
    run.close()


def test_ops_without_shapes_are_unknown_not_guessed(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": {}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20.0, "dur": 5.0,
           "args": {"Input Dims": [[8, 16], [16, 4]], "Input type": ["float", "float"]}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 30.0, "dur": 10.0,
           "args": {"Input Dims": [[8, 16], [4, 16], [4]], "Input type": ["float", "float", "float"]}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 31.0, "dur": 8.0,
           "args": {"Input Dims": [[4], [8, 16], [16, 4]], "Input type": ["float", "float", "float"]}}]
    (d / "rank0.trace.json").write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 1}}))
    run = tracekit.open(str(d), store=str(tmp_path / "st"))
    df = run.analyze("flops_by_op").set_index("name")
    assert df.loc["aten::mm", "flops"] == 2 * 8 * 16 * 4 and df.loc["aten::mm", "unknown_count"] == 1
    assert df.loc["aten::addmm", "flops"] == 2 * 8 * 16 * 4  # the leaf; its parent linear is not counted
    assert "aten::linear" not in df.index
    assert "no recorded shapes" in run.analyze("flops_by_op").attrs["note"]
    run.close()


@pytest.mark.parametrize("name, device", [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"), ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("Tesla V100-SXM2-16GB", "V100-SXM2"), ("Tesla V100-PCIE-32GB", "V100-PCIe"),
    ("NVIDIA L4", "L4"), ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI250X/MI250", "MI250X"),
    ("NVIDIA GeForce RTX 4090", None), (None, None)])
def test_device_names_match_the_catalog(name, device):
    d = devices.match(name, devices.catalog())
    assert (d.name if d else None) == device
    if d is not None:
        assert d.source and d.memory_gbps and d.peaks_tflops


def test_a_users_catalog_overrides_and_a_bad_field_is_one_line(tmp_path, monkeypatch):
    good = tmp_path / "mine.toml"
    good.write_text('[devices.A100-SXM4-80GB]\nmatch = "A100"\nbf16 = 300.0\nsource = "our benchmark"\n')
    d = devices.match("NVIDIA A100-SXM4-80GB", devices.catalog(str(good)))
    assert d.peak("bf16") == 300.0 and d.source == "our benchmark"
    bad = tmp_path / "bad.toml"
    bad.write_text('[devices.X]\nmatch = "X"\nbf16 = "fast"\nsource = "s"\n')
    with pytest.raises(tracekit.TracekitError, match=r"bad.toml: devices.X.bf16: 'fast' is not allowed"):
        devices.catalog(str(bad))
    d = shared_trace_dir("astra-sim/megatron_tp8")
    res = CliRunner().invoke(cli, ["analyze", "mfu", str(d), "--store", str(tmp_path / "m"), "--catalog", str(bad)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "devices.X.bf16" in res.output


@pytest.mark.slow  # a real 8-rank GPU trace
def test_mfu_and_roofline_on_a_real_gpu_trace(tmp_path):
    d = shared_trace_dir("astra-sim/megatron_tp8")
    run = tracekit.open(str(d), store=str(tmp_path / "m"))
    m = run.analyze("mfu")
    assert len(m) == 8 and (m.device == "A100-SXM4-80GB").all() and (m.dtype == "fp16").all()
    assert ((m.mfu_pct > 0) & (m.mfu_pct <= 100)).all()
    rf = run.analyze("roofline").set_index(["rank", "op_class"])
    g = rf.loc[(0, "gemm")]
    assert g.bound == "compute" and 0 < g.share_pct <= 100
    assert rf.loc[(0, "elementwise")].bound == "memory"
    run.close()
