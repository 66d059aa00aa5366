"""Flight-recorder dumps: ingest into fr_entries, the restricted unpickler, and `tracekit comms check`."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from analyses import comms
from tracekit.cli import cli
from tracekit.errors import TraceFileError
from tracekit.ingest.flight_recorder import load_pickle

from .conftest import write_trace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
STEP = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0}]


def _entry(seq, op="nccl:all_reduce", size=1024, dtype="Float", state="completed"):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "op_id": seq, "profiling_name": op, "input_sizes": [[size]],
            "input_dtypes": [dtype], "output_sizes": [[size]], "output_dtypes": [dtype],
            "time_created_ns": 1_000_000 * seq, "time_discovered_started_ns": 1_000_000 * seq + 10,
            "time_discovered_completed_ns": 1_000_000 * seq + 500 if state == "completed" else 0,
            "duration_ms": 0.5, "timeout_ms": 600000, "state": state, "retired": state == "completed",
            "frames": [{"name": "all_reduce", "filename": "train.py", "line": 42}], "thread_id": "1", "thread_name": "main"}


def _dump(entries, world=4):
    return {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": max(e["collective_seq_id"] for e in entries),
                                "last_started_collective": -1, "last_completed_collective": -1}},
            "entries": entries}


def _hung_job(d: Path, pickle_rank: int | None = None) -> Path:
    """4 ranks; ranks 0, 1, 3 entered collective 6 and wait in it; rank 2 never joined it (it completed 1-5)."""
    for rank in range(4):
        entries = [_entry(s) for s in range(1, 6)]
        if rank != 2:
            entries.append(_entry(6, state="started"))
        write_trace(d / f"rank{rank}.trace.json", STEP, rank=rank, world_size=4, base_ns=10**18)
        if rank == pickle_rank:
            (d / f"rank{rank}.fr.pkl").write_bytes(pickle.dumps(_dump(entries)))
        else:
            (d / f"rank{rank}.fr.json").write_text(json.dumps(_dump(entries)))
    return d


def test_skipped_collective_names_the_missing_rank(tmp_path):
    d = _hung_job(tmp_path / "hung", pickle_rank=3)  # rank 3's dump is a (plain) pickle
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        assert run.ranks == [0, 1, 2, 3]  # dumps are no extra ranks
        n = run.sql("SELECT rank, count(*) AS n FROM fr_entries GROUP BY rank ORDER BY rank")
        assert list(n["n"]) == [6, 6, 5, 6]
        issues = comms.comms_check(run)
        missing = issues[issues["issue"] == "missing_ranks"]
        assert len(missing) == 1
        row = missing.iloc[0]
        assert row["collective_seq_id"] == 6 and row["suspect_ranks"] == [2] and row["ranks_present"] == [0, 1, 3]
        assert row["op"] == "nccl:all_reduce" and row["pg_name"] == "0"
        last = comms.comms_last_completed(run).set_index("rank")
        assert list(last["last_completed_seq"]) == [5, 5, 5, 5] and list(last["last_started_seq"]) == [6, 6, 5, 6]
        assert list(last["last_enqueued_seq"]) == [6, 6, 5, 6]


def test_mismatches_name_the_odd_rank(tmp_path):
    d = tmp_path / "mm"
    for rank in range(3):
        entries = [_entry(1), _entry(2, size=2048 if rank == 1 else 1024),
                   _entry(3, op="nccl:broadcast" if rank == 2 else "nccl:all_reduce", dtype="Half" if rank == 0 else "Float")]
        (d / f"rank{rank}.fr.json").parent.mkdir(exist_ok=True)
        (d / f"rank{rank}.fr.json").write_text(json.dumps(_dump(entries, world=3)))
        write_trace(d / f"rank{rank}.trace.json", STEP, rank=rank, world_size=3, base_ns=10**18)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        got = {(r.collective_seq_id, r.issue): r.suspect_ranks for r in comms.comms_check(run).itertuples()}
    assert got == {(2, "size_mismatch"): [1], (3, "op_mismatch"): [2], (3, "dtype_mismatch"): [0]}


def test_bundled_sample_dumps_agree(tmp_path):
    with tracekit.open(SAMPLES / "ddp4_loopback", store=str(tmp_path / "s")) as run:
        assert comms.comms_check(run).empty
        last = comms.comms_last_completed(run)
        assert list(last["rank"]) == [0, 1, 2, 3] and (last["behind_by"] == 0).all()
        # gloo leaves entries 'scheduled': progress comes from pg_status
        assert last["last_completed_seq"].notna().all()


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "rank0.fr.pkl"
    bad.write_bytes(pickle.dumps({"version": "2.4", "entries": [Evil()]}))
    with pytest.raises(TraceFileError, match="refused to load posix.system|refused to load os.system"):
        load_pickle(str(bad))
    assert not marker.exists()
    # through ingest and the CLI: a clear one-line error, nothing executed, no store committed
    write_trace(tmp_path / "rank0.trace.json", STEP, rank=0, world_size=1, base_ns=10**18)
    r = CliRunner().invoke(cli, ["comms", "check", str(tmp_path), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "rank0.fr.pkl" in r.output and "refused" in r.output
    assert not marker.exists()


def test_plain_pickle_loads(tmp_path):
    p = tmp_path / "d.pkl"
    p.write_bytes(pickle.dumps({"entries": [{"a": 1, "b": [1.5, "x", None, True], "c": (1, 2)}]}))
    assert load_pickle(str(p)) == {"entries": [{"a": 1, "b": [1.5, "x", None, True], "c": (1, 2)}]}


def test_cli_check_json(tmp_path):
    d = _hung_job(tmp_path / "hung")
    r = CliRunner().invoke(cli, ["comms", "check", str(d), "--store", str(tmp_path / "s"), "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [i["suspect_ranks"] for i in out["issues"] if i["issue"] == "missing_ranks"] == [[2]]
    assert [x["behind_by"] for x in out["last_completed"]] == [0, 0, 0, 0]


def test_check_without_dumps_is_a_clear_error(tmp_path):
    write_trace(tmp_path / "rank0.trace.json", STEP, rank=0, world_size=1, base_ns=10**18)
    r = CliRunner().invoke(cli, ["comms", "check", str(tmp_path), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "no flight-recorder dumps" in r.output
