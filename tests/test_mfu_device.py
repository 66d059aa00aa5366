"""MFU and the roofline on a GPU trace that does not name its GPU (no deviceProperties): the note says what is
missing and how to name it; --device NAME (a device catalog name) gives the peaks, in analyze and in doctor."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import tracekit
from analyses.devices import catalog
from tracekit.cli import cli

from .conftest import REPO, shared_trace_dir, write_trace
from .test_hardware import _events

H100 = next(d for d in catalog() if d.name == "H100-SXM")


@pytest.fixture(scope="module")
def unnamed(tmp_path_factory):
    """test_hardware's A100 run (an fp16 GEMM of 4096^3, an fp32 one, an add, per step) with deviceProperties
    left out, as some profilers and exporters write it."""
    d = tmp_path_factory.mktemp("unnamed") / "run"
    write_trace(d / "rank0.trace.json", _events(), rank=0, world_size=1)  # write_trace's deviceProperties: []
    return d


def test_kernels_without_device_properties_say_what_is_missing(unnamed, tmp_path):
    with tracekit.open(str(unnamed), store=str(tmp_path / "s")) as run:
        n_kernels = int(run.sql("SELECT count(*) AS n FROM kernels").n.iloc[0])
        m, rf = run.analyze("mfu"), run.analyze("roofline")
    assert n_kernels == 12
    for df, nulls in ((m, "mfu_pct is null"), (rf, "bound, attainable_tflops and share_pct are null")):
        note = df.attrs["note"]
        assert f"rank 0: {n_kernels} GPU kernels, but the trace does not name their device (it has no " \
               f"deviceProperties): {nulls}" in note
        assert "name the GPU with --device NAME" in note and "H100-SXM" in note and "a CPU run" not in note
        assert df.device.isna().all()
    assert m.mfu_pct.isna().all() and rf.share_pct.isna().all()


def test_device_gives_the_catalog_peaks(unnamed, tmp_path):
    with tracekit.open(str(unnamed), store=str(tmp_path / "s")) as run:
        m = run.analyze("mfu", device="H100-SXM")
        rf = run.analyze("roofline", device="h100-sxm")  # the catalog name, any case
        named = run.analyze("mfu", device="NVIDIA H100 80GB HBM3")  # a deviceProperties name matches too
    assert m.attrs["note"] == "" and rf.attrs["note"] == ""
    row = m.iloc[0]
    assert (row.device, row["dtype"], row.peak_tflops) == ("H100-SXM", "fp16", H100.peak("fp16"))
    assert row.mfu_pct == pytest.approx(100.0 * row.achieved_tflops / H100.peak("fp16"))
    gemm = rf[rf.op_class == "gemm"].set_index("dtype")
    assert gemm.loc["fp16", "bound"] == "compute"
    assert gemm.loc["fp16", "attainable_tflops"] == H100.peak("fp16")
    assert (rf.device == "H100-SXM").all() and rf.share_pct.notna().all()
    assert named.device.iloc[0] == "H100-SXM"


def test_device_overrides_what_the_trace_names(tmp_path):
    from .test_hardware import _trace

    with tracekit.open(str(_trace(tmp_path / "a100")), store=str(tmp_path / "s")) as run:
        assert run.analyze("mfu").device.iloc[0] == "A100-SXM4-80GB"
        assert run.analyze("mfu", device="H100-SXM").device.iloc[0] == "H100-SXM"


def test_a_cpu_run_still_says_so(tmp_path):
    with tracekit.open(str(REPO / "sample_traces" / "ddp3_slow_rank1"), store=str(tmp_path / "s")) as run:
        note = run.analyze("mfu").attrs["note"]
    assert "rank 0: no GPU device in the trace (a CPU run): mfu_pct is null" in note and "--device" not in note


def test_cli_device(unnamed, tmp_path):
    store = str(tmp_path / "s")
    res = CliRunner().invoke(cli, ["analyze", "mfu", str(unnamed), "--store", store, "--device", "H100-SXM",
                                   "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert "H100-SXM,fp16," in res.output
    res = CliRunner().invoke(cli, ["analyze", "roofline", str(unnamed), "--store", store, "--device", "H900"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "--device 'H900': not in the device catalog; one of: V100-SXM2" in res.output
    res = CliRunner().invoke(cli, ["analyze", "kernel_breakdown", str(unnamed), "--store", store, "--device", "H100-SXM"])
    assert res.exit_code == 2 and "kernel_breakdown: unknown parameter(s) --device; it takes" in res.output
    res = CliRunner().invoke(cli, ["doctor", str(unnamed), "--store", store, "--device", "H900"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--device 'H900'" in res.output, res.output


@pytest.mark.slow
def test_doctor_low_mfu_with_device(unnamed, tmp_path):
    # without a device the roofline has no share to judge; with one, low_mfu finds the GEMMs far below it
    from tracekit.advice import doctor

    with tracekit.open(str(unnamed), store=str(tmp_path / "s")) as run:
        found = doctor(run, device="H100-SXM")
    low = [f for f in found if f["kind"] == "low_mfu"]
    assert len(low) == 1 and "on H100-SXM" in low[0]["evidence"][0]["figure"]
    res = CliRunner().invoke(cli, ["doctor", str(unnamed), "--store", str(tmp_path / "s"), "--format", "json"])
    assert res.exit_code == 0 and '"low_mfu"' not in res.output


def test_shared_gpu_trace_without_device_properties(tmp_path):
    # hta/trace_filter: two ranks of a 128-rank GPU job, about 1,100 kernels each, no deviceProperties
    with tracekit.open(str(shared_trace_dir("hta/trace_filter")), store=str(tmp_path / "s")) as run:
        m = run.analyze("mfu")
        given = run.analyze("mfu", device="H100-SXM")
    assert "rank 0: 1154 GPU kernels, but the trace does not name their device" in m.attrs["note"]
    assert "rank 1: 1104 GPU kernels" in m.attrs["note"] and m.mfu_pct.isna().all()
    assert (given.device == "H100-SXM").all() and given.mfu_pct.notna().all() and given.attrs["note"] == ""


def test_report_device(unnamed, tmp_path):
    pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")
    from tracekit.report.html import mfu_html

    with tracekit.open(str(unnamed), store=str(tmp_path / "s")) as run:
        unknown, known = mfu_html(run), mfu_html(run, device="H100-SXM")
    assert "<b>MFU: not known</b> (rank 0: 12 GPU kernels, but the trace does not name their device" in unknown
    assert "name the GPU with --device NAME" in unknown
    assert f"of H100-SXM fp16 peak {H100.peak('fp16'):.4g} TFLOP/s" in known
    res = CliRunner().invoke(cli, ["report", str(unnamed), "--store", str(tmp_path / "s"), "-o",
                                   str(tmp_path / "r.html"), "--device", "H900"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--device 'H900'" in res.output, res.output
    assert not (tmp_path / "r.html").exists()
