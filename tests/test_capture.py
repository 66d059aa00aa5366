"""Capture: a real 2-rank gloo job under tracekit.capture.profile, `record`, and bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.errors import TracekitError


def _torch():
    return pytest.importorskip("torch", reason="capture tests need torch (pip install 'tracekit[capture]')")


# ---- without torch ---------------------------------------------------------------------------------
def test_missing_torch_is_one_clear_line_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    from tracekit.capture._torch import require_torch

    with pytest.raises(TracekitError, match=r"tracekit\[capture\]"):
        require_torch()
    r = CliRunner().invoke(cli, ["demo-train", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2, r.output
    assert "pip install 'tracekit[capture]'" in r.output
    assert "Traceback" not in r.output


def test_core_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import tracekit, tracekit.capture, tracekit.capture.demo, tracekit.capture.record, tracekit.testbed\n"
            "import tracekit.cli\n"
            "assert 'torch' not in {m for m in sys.modules if sys.modules[m] is not None}\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_new_commands_have_help_with_example():
    runner = CliRunner()
    for argv in (["record"], ["demo-train"], ["testbed"], ["testbed", "probe"], ["testbed", "cleanup"]):
        r = runner.invoke(cli, [*argv, "--help"])
        assert r.exit_code == 0, r.output
        assert "Example:" in r.output, argv


def test_profile_rejects_bad_arguments(tmp_path, monkeypatch):
    from tracekit.capture import profile

    monkeypatch.delenv("TRACEKIT_OUT_DIR", raising=False)
    with pytest.raises(TracekitError, match="steps must be >= 1"):
        profile(tmp_path, steps=0)
    with pytest.raises(TracekitError, match="TRACEKIT_OUT_DIR"):
        profile()


def test_demo_train_bad_option_is_exit_2(tmp_path):
    r = CliRunner().invoke(cli, ["demo-train", "--out", str(tmp_path / "d"), "--ranks", "2", "--slow-rank", "5"])
    assert r.exit_code == 2
    assert "--slow-rank 5" in r.output
    r = CliRunner().invoke(cli, ["demo-train", "--out", str(tmp_path / "d"), "--slow-link", "nonsense"])
    assert r.exit_code == 2
    assert "HOST:RATE_MBIT" in r.output


def test_end_process_flushes_output_and_exits_with_the_code():
    # stdout is a pipe here, so the unterminated lines sit in Python's buffers until end_process flushes them
    code = ("import sys, tracekit.capture as c; print('trace written', end=''); "
            "print('note', end='', file=sys.stderr); c.end_process(3); print('never')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 3
    assert r.stdout == "trace written" and r.stderr == "note"


# ---- record ------------------------------------------------------------------------------------------
def test_record_failing_command_returns_its_exit_code(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        out = os.environ["TRACEKIT_OUT_DIR"]
        open(os.path.join(out, "rank0.fr.json"), "w").write('{"entries": []}')
        sys.exit(3)
    """))
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["record", "--out", str(out), "--", sys.executable, str(script)])
    assert r.exit_code == 3, r.output
    assert (out / "rank0.fr.json").exists()
    assert "command exited with code 3" in r.output
    assert not (out / ".tracekit-record").exists()


def test_record_command_not_found_and_existing_capture(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["record", "--out", str(out), "--", "tk-no-such-command-xyz"])
    assert r.exit_code == 2
    assert "command not found: tk-no-such-command-xyz" in r.output
    (out / "run.json").write_text("{}")
    r = CliRunner().invoke(cli, ["record", "--out", str(out), "--", sys.executable, "-c", "pass"])
    assert r.exit_code == 2
    assert "already holds a capture" in r.output and "--force" in r.output


@pytest.mark.slow  # a real torch.distributed job
def test_record_keeps_traces_of_a_job_that_fails_after_profiling(tmp_path):
    _torch()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, tracekit.capture
        model = torch.nn.Linear(16, 16)
        with tracekit.capture.profile(steps=2, warmup=0, parallel={"dp": 1}) as prof:
            for _ in range(2):
                model(torch.randn(4, 16)).sum().backward()
                prof.step()
        sys.exit(5)  # the job dies after its profiled steps
    """))
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["record", "--out", str(out), "--", sys.executable, str(script)])
    assert r.exit_code == 5, r.output
    assert {"rank0.trace.json.gz", "run.json", "rank0.fr.json"} <= set(os.listdir(out))
    import tracekit

    run = tracekit.open(str(out))
    assert run.sql("SELECT count(*) AS n FROM steps")["n"][0] == 2


# ---- a real 2-rank gloo job ------------------------------------------------------------------------
@pytest.mark.slow  # a real torch.distributed job
def test_two_rank_gloo_capture_ingests_with_manifest_and_flight_recorder(tmp_path):
    _torch()
    import tracekit
    from tracekit.capture.demo import DemoConfig, run

    out = tmp_path / "ddp2"
    doc = run(DemoConfig(out_dir=str(out), ranks=2, steps=2, warmup=1, timed_steps=1, d_model=32, layers=1,
                         vocab=128, seq_len=16, batch_size=4))
    names = set(os.listdir(out))
    assert {"rank0.trace.json.gz", "rank1.trace.json.gz", "rank0.fr.json", "rank1.fr.json", "run.json"} <= names

    # The manifest is complete.
    with open(out / "run.json") as f:
        assert json.load(f) == doc
    for key in ("world_size", "backend", "hostnames", "device_names", "torch_version", "nccl_version",
                "parallel", "step_count", "step_times_ns", "ranks"):
        assert key in doc, key
    assert doc["world_size"] == 2 and doc["backend"] == "gloo"
    assert doc["step_count"] == 4 and len(doc["step_times_ns"]) == 4
    assert all(t > 0 for t in doc["step_times_ns"])
    assert doc["parallel"]["dp"] == 2 and doc["parallel"]["model_params"] > 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["profiled_steps"] == [1, 2] for r in doc["ranks"])

    # Flight-recorder entries are there, as JSON, one per collective.
    for rank in (0, 1):
        with open(out / f"rank{rank}.fr.json") as f:
            fr = json.load(f)
        assert "traceEvents" not in fr
        ops = [e["profiling_name"] for e in fr["entries"]]
        assert "gloo:all_reduce" in ops
        assert doc["ranks"][rank]["flight_recorder_entry_count"] == len(fr["entries"])

    # The store ingests it: both ranks, the profiled steps, the gloo collectives.
    run_ = tracekit.open(str(out))
    ranks = run_.sql("SELECT rank, world_size FROM ranks ORDER BY rank")
    assert ranks["rank"].tolist() == [0, 1] and set(ranks["world_size"]) == {2}
    steps = run_.sql("SELECT rank, count(*) AS n FROM steps GROUP BY rank ORDER BY rank")
    assert steps["n"].tolist() == [2, 2]
    n_allreduce = run_.sql("SELECT count(*) AS n FROM cpu_ops WHERE name = 'c10d::allreduce_'")["n"][0]
    assert n_allreduce >= 4  # at least one bucket per profiled step per rank


@pytest.mark.slow
def test_record_gathers_a_torchrun_job(tmp_path):
    _torch()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch, torch.distributed as dist, tracekit.capture
        prof = tracekit.capture.profile(steps=2, warmup=1, parallel={"dp": 2})
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
        with prof:
            for _ in range(4):
                model(torch.randn(4, 32)).sum().backward()
                prof.step()
        dist.destroy_process_group()
        tracekit.capture.end_process(0)  # DDP on gloo: no interpreter teardown to race (capture/teardown.py)
    """))
    from tracekit.capture.demo import _free_port

    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["record", "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                                 "--nproc-per-node", "2", "--master-port", str(_free_port()), str(script)])
    assert r.exit_code == 0, r.output
    with open(out / "run.json") as f:
        doc = json.load(f)
    assert doc["world_size"] == 2 and doc["parallel"] == {"dp": 2}
    assert {f"rank{r}.trace.json.gz" for r in (0, 1)} <= set(os.listdir(out))
