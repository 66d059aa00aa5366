"""Scale: bounded memory on a large trace, spilling derived tables, exact timestamps, many rank files.

No wall-clock assertions: memory is measured as peak RSS of a fresh process (VmHWM and ru_maxrss, the
ingest's own and its worker children's).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import duckdb
import pytest

import tracekit.ingest.kineto as kineto
from tracekit.ingest import ingest
from tracekit.store import Store

from .conftest import REPO, tiny_events, write_trace

pytestmark = pytest.mark.slow  # big traces and many ranks

SAMPLE_RANK = REPO / "sample_traces" / "ddp4_loopback" / "rank0.trace.json.gz"


def _make_big_trace():
    spec = importlib.util.spec_from_file_location("make_big_trace", REPO / "bench" / "make_big_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_big_trace


# VmHWM, not ru_maxrss, for the measuring process itself: Linux carries ru_maxrss across fork + exec, so
# a child of a big pytest process (the whole suite) starts at its parent's high-water mark; VmHWM
# belongs to the new address space. Its own children are forked from it, small.
_MEASURE = """
import json, resource, sys
from tracekit.ingest import ingest

def hwm_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024

before = hwm_mb()
ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"before_mb": before, "peak_mb": max(hwm_mb(), kids)}))
"""


def _peak_rss(trace_dir: Path, store: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_MEASURE), str(trace_dir), str(store)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_peak_memory_of_a_large_trace_stays_bounded(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    made = _make_big_trace()(str(d / "rank0.trace.json.gz"), 100_000_000, str(SAMPLE_RANK))
    size_mb = made["bytes"] / 1e6
    assert size_mb >= 100
    m = _peak_rss(d, tmp_path / "store")
    # today ~170 MB for 100 MB, ~350 MB for 0.5 GB, ~750 MB for 2 GB (bench/big_ingest.py): far
    # below 3x the file, and it stops growing with the file
    assert m["peak_mb"] < 2.5 * size_mb, m
    run = Store(str(tmp_path / "store"))
    assert run.manifest.sources["rank0.trace.json.gz"].event_count == made["events"]
    con = run.connect()
    n_steps, n_ranks = con.execute("SELECT count(*), count(DISTINCT rank) FROM steps").fetchall()[0]
    assert n_ranks == 1 and n_steps >= 3 * made["copies"] - 3  # every copy's steps (the last may be cut)


def test_derived_tables_identical_when_they_spill(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir()
    _make_big_trace()(str(d / "rank0.trace.json.gz"), 8_000_000, str(SAMPLE_RANK))
    write_trace(d / "rank1.trace.json", tiny_events(n_steps=50), rank=1, world_size=2)
    ingest(str(d), str(tmp_path / "roomy"), progress=False, jobs=1)
    monkeypatch.setattr(kineto, "DERIVED_MEMORY", "24MB")  # forces DuckDB to spill the joins and sorts
    ingest(str(d), str(tmp_path / "tight"), progress=False, jobs=1)
    a, b = Store(str(tmp_path / "roomy")).connect(), Store(str(tmp_path / "tight")).connect()
    for table in ("steps", "flows", "memory", "gpu_args", "comm_args", "events", "ranks"):
        ta = a.sql(f"SELECT * FROM {table}").to_arrow_table()  # noqa: F841 (read by DuckDB below)
        tb = b.sql(f"SELECT * FROM {table}").to_arrow_table()  # noqa: F841
        con = duckdb.connect()
        assert ta.num_rows == tb.num_rows and (ta.num_rows > 0 or table == "comm_args"), table
        for x, y in (("ta", "tb"), ("tb", "ta")):
            assert con.execute(f"SELECT count(*) FROM (FROM {x} EXCEPT ALL FROM {y})").fetchall()[0][0] == 0, table
    assert not list((tmp_path / "tight").rglob("spill"))  # the spill directory goes with the staging


def _exact_ns(text: str, base: int) -> int:
    return int((Decimal(text) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP)) + base  # as DuckDB's round


def _ts_trace(path: Path, texts: list[str], base: int, gz: bool) -> None:
    events = ",".join(f'{{"ph":"i","s":"t","name":"e{i}","pid":1,"tid":1,"ts":{t}}}' for i, t in enumerate(texts))
    body = f'{{"baseTimeNanoseconds":{base},"distributedInfo":{{"rank":0}},"traceEvents":[{events}]}}'.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(body) if gz else body)


@pytest.mark.parametrize("gz", [False, True])
def test_large_fractional_timestamps_are_exact(tmp_path, monkeypatch, gz):
    """Kineto's relative us (13 digits, 3 decimals) take DuckDB's own reading; more decimals, or values
    from 2^43 us on, take the text path; both give the exact ns."""
    import random

    rnd = random.Random(7)
    base = 1790857026000000000
    # (13 digits from 8e12 on go to the text path too: the check is conservative below 2^43 = 8.8e12)
    fast = [f"{rnd.randrange(10**12, 8 * 10**12)}.{rnd.randrange(1000):03d}" for _ in range(3000)]
    fast += ["5348872661469.606", "5348872661469.6", "4398046511104.001", "7999999999999.999", "1000000000000.000",
             "-5348872661469.606", "12", "0.5"]
    slow = ["8796093022208.001", "8796093022207.999", "9999999999999.999", "12345678901234.5", "5348872661469.6069",
            "5348872661469.6065", "5348872661469.606"]
    name = "rank0.json.gz" if gz else "rank0.json"
    _ts_trace(tmp_path / "fast" / name, fast, base, gz)
    _ts_trace(tmp_path / "slow" / name, slow, base, gz)
    calls = []
    real = kineto._exact_ts
    monkeypatch.setattr(kineto, "_exact_ts", lambda *a, **k: calls.append(1) or real(*a, **k))
    for what, texts in (("fast", fast), ("slow", slow)):
        ingest(str(tmp_path / what), str(tmp_path / f"{what}.store"), progress=False, jobs=1)  # in-process
        con = Store(str(tmp_path / f"{what}.store")).connect()
        got = dict(con.execute("SELECT name, ts_ns FROM events").fetchall())
        for i, t in enumerate(texts):
            assert got[f"e{i}"] == _exact_ns(t, base), (what, i, t)
        assert bool(calls) == (what == "slow")  # the fast chunk never decoded its text a second time


def test_a_non_number_ts_still_named_with_its_event(tmp_path):
    """The fast timestamp path gives way to the one whose errors name the event."""
    d = tmp_path / "run"
    d.mkdir()
    ev = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 5348872661469.606, "dur": 1.5},
          {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": {"oops": 1}, "dur": 2}]
    (d / "rank0.json").write_text(json.dumps({"traceEvents": ev}))
    from tracekit.errors import TraceFileError

    with pytest.raises(TraceFileError) as e:
        ingest(str(d), str(tmp_path / "store"), progress=False)
    assert "traceEvents[1]" in str(e.value)


def test_many_rank_files_through_the_pool(tmp_path):
    d = tmp_path / "run"
    n = 48
    for r in range(n):
        write_trace(d / f"rank{r}.trace.json.gz", tiny_events(n_steps=2, t0_us=1000.0 + r), rank=r, world_size=n)
    r1 = ingest(str(d), str(tmp_path / "store"), progress=False, executor="local[2]")
    assert len(r1.ingested) == n
    s = Store(str(tmp_path / "store"))
    assert s.ranks == list(range(n))
    con = s.connect()
    assert con.execute("SELECT count(DISTINCT rank), count(*) FROM steps").fetchall()[0] == (n, 2 * n)
    assert con.execute("SELECT count(*) FROM ranks WHERE world_size = ?", [n]).fetchall()[0][0] == n
    r2 = ingest(str(d), str(tmp_path / "store"), progress=False, executor="local[2]")
    assert r2.ingested == [] and len(r2.unchanged) == n
