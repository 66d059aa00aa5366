"""Incremental, atomic, crash-safe and single-writer behaviour of the store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest

import tracekit
from tracekit.errors import StoreError, TracekitError, TraceFileError
from tracekit.ingest import ingest
from tracekit.store import Store, default_store_dir, writer_lock

from .conftest import REPO, tiny_events, write_trace


def _counts(store_dir):
    run = tracekit.open(str(store_dir))
    return run.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank")["n"].tolist()


def test_incremental_skip_replace_remove(tiny_dir, tmp_path):
    store = tmp_path / "s"
    r1 = ingest(str(tiny_dir), str(store))
    assert sorted(r1.ingested) == ["rank0.trace.json.gz", "rank1.trace.json"]
    before = json.loads((store / "manifest.json").read_text())
    r2 = ingest(str(tiny_dir), str(store))
    assert r2.ingested == [] and sorted(r2.unchanged) == sorted(r1.ingested)
    assert json.loads((store / "manifest.json").read_text())["sources"] == before["sources"]
    # touched but identical: the hash says unchanged
    os.utime(tiny_dir / "rank1.trace.json", ns=(time.time_ns(), time.time_ns()))
    assert ingest(str(tiny_dir), str(store)).ingested == []
    # changed: only that partition is replaced
    write_trace(tiny_dir / "rank1.trace.json", tiny_events(5), rank=1, world_size=2)
    r3 = ingest(str(tiny_dir), str(store))
    assert r3.ingested == ["rank1.trace.json"]
    assert _counts(store) == [len(tiny_events(2)), len(tiny_events(5))]
    old_files = before["sources"]["rank1.trace.json"]["files"]["events"]
    assert not any((store / f).exists() for f in old_files)  # replaced partition is gone
    # removed source: its rank leaves the store
    (tiny_dir / "rank1.trace.json").unlink()
    r4 = ingest(str(tiny_dir), str(store))
    assert r4.removed == ["rank1.trace.json"]
    assert tracekit.open(str(store)).ranks == [0]
    assert not (store / "events" / "rank=1").exists()


def test_bad_file_leaves_previous_store_unchanged(tiny_dir, tmp_path):
    store = tmp_path / "s"
    ingest(str(tiny_dir), str(store))
    manifest = (store / "manifest.json").read_bytes()
    (tiny_dir / "rank1.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": "soon"}]}')
    with pytest.raises(TraceFileError) as e:
        ingest(str(tiny_dir), str(store))
    assert "rank1.trace.json" in str(e.value)
    assert (store / "manifest.json").read_bytes() == manifest
    assert _counts(store) == [len(tiny_events(2))] * 2
    assert not (store / "staging").exists()
    # --skip-bad keeps going without it and says so
    r = ingest(str(tiny_dir), str(store), skip_bad=True)
    assert "rank1.trace.json" in r.failed
    assert tracekit.open(str(store)).ranks == [0]


_KILLER = r"""
import sys
from tracekit.ingest import ingest
ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
"""


@pytest.mark.slow  # kills ingest processes mid-write
@pytest.mark.parametrize("delay_s", [0.05, 0.3, 0.8])
def test_kill_9_during_ingest_keeps_previous_store(tmp_path, delay_s):
    d = tmp_path / "t"
    for r in range(3):
        write_trace(d / f"rank{r}.json.gz", tiny_events(400, t0_us=1000.0 + r), rank=r, world_size=3)
    store = tmp_path / "s"
    ingest(str(d), str(store))
    reference = _store_dump(store)
    manifest = (store / "manifest.json").read_bytes()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", _KILLER, str(d), str(store)], env=env)
    time.sleep(delay_s)
    p.send_signal(signal.SIGKILL)
    p.wait()
    # whatever moment it died at, the previous store reads as before
    if (store / "manifest.json").read_bytes() == manifest:
        assert _store_dump(store) == reference
    else:  # it finished before the kill: a complete new store
        assert _store_dump(store) == reference
    ingest(str(d), str(store), force=True)
    assert _store_dump(store) == reference
    assert not (store / "staging").exists()


def _store_dump(store):
    run = tracekit.open(str(store))
    return run.sql("SELECT * EXCLUDE (event_id) FROM events ORDER BY rank, event_id").to_csv()


def test_concurrent_writer_waits_then_fails_cleanly(tmp_path):
    store = tmp_path / "s"
    release = threading.Event()
    held = threading.Event()

    def hold():
        with writer_lock(str(store)):
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    waited = []
    try:
        with pytest.raises(StoreError) as e:
            with writer_lock(str(store), wait_s=0.3, on_wait=lambda: waited.append(1)):
                pass
        assert "another tracekit ingest" in str(e.value) and waited == [1]
    finally:
        release.set()
        t.join()
    with writer_lock(str(store), wait_s=1):
        pass


def test_two_processes_ingest_same_directory(tiny_dir, tmp_path):
    store = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _KILLER, str(tiny_dir), str(store)], env=env) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    assert _counts(store) == [len(tiny_events(2))] * 2


def test_store_readers_and_errors(tiny_dir, tmp_path):
    with pytest.raises(StoreError):
        Store(str(tmp_path / "nothing"))
    ingest(str(tiny_dir), str(tmp_path / "s"))
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    m["schema_version"] = 999
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError) as e:
        Store(str(tmp_path / "s"))
    assert "ingest" in str(e.value)
    # a re-ingest rebuilds a store of another schema version
    ingest(str(tiny_dir), str(tmp_path / "s"))
    assert Store(str(tmp_path / "s")).ranks == [0, 1]


def test_default_store_location(tmp_path, monkeypatch):
    d = tmp_path / "t"
    d.mkdir()
    assert default_store_dir(str(d)) == str(d / ".tracekit")
    # a read-only trace directory (shared, or another user's): the store goes to a cache dir
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    import tracekit.store as store_mod

    monkeypatch.setattr(store_mod.os, "access", lambda p, mode: os.path.abspath(p) != str(d))
    other = default_store_dir(str(d))
    assert other.startswith(str(tmp_path / "cache")) and other == default_store_dir(str(d) + "/")


def test_parquet_layout_is_hive_partitioned(tiny_dir, tmp_path):
    import duckdb

    store = tmp_path / "s"
    ingest(str(tiny_dir), str(store))
    # any engine can read the directory as it is: no manifest needed
    n = duckdb.sql(f"SELECT rank, count(*) FROM read_parquet('{store}/events/*/*.parquet', hive_partitioning=true) "
                   "GROUP BY rank ORDER BY rank").fetchall()
    assert n == [(0, len(tiny_events(2))), (1, len(tiny_events(2)))]


def test_query_connection_is_sandboxed(tiny_dir, tmp_path):
    run = tracekit.open(str(tiny_dir), store=str(tmp_path / "s"))
    with pytest.raises(TracekitError):
        run.sql("SELECT * FROM read_csv('/etc/passwd')")
    target = tmp_path / "leak.csv"
    with pytest.raises(TracekitError):
        run.sql(f"COPY (SELECT 1) TO '{target}'")
    assert not target.exists()
    with pytest.raises(TracekitError):
        run.sql("SET enable_external_access = true")


def test_queries_cannot_overwrite_the_store(tiny_dir, tmp_path):
    """The store's files are readable, and DuckDB would write wherever it may read."""
    run = tracekit.open(str(tiny_dir), store=str(tmp_path / "s"))
    victim = run.store.files("steps")[0]
    before = open(victim, "rb").read()
    for sql in (f"COPY (SELECT 1 AS x) TO '{victim}' (FORMAT parquet, USE_TMP_FILE false)",
                f"ATTACH '{victim}' AS x", "INSTALL httpfs", "LOAD httpfs",
                f"EXPORT DATABASE '{tmp_path / 'export'}'"):
        with pytest.raises(TracekitError) as e:
            run.sql(sql)
        assert "refused" in str(e.value) or "Permission" in str(e.value), sql
    assert open(victim, "rb").read() == before
    assert not (tmp_path / "export").exists()
    assert len(run.sql("SELECT * FROM steps")) == 4  # reading still works


def test_views_over_stand_ins_match_views_over_the_files(tiny_dir, tmp_path):
    """connect creates the public views over empty stand-ins, then the Parquet views: every view must
    have the columns, types and rows it has when created over the Parquet views directly."""
    import duckdb

    from tracekit.store import _VIEWS_SQL, create_table_view, devices
    from tracekit.store.schema import TABLES

    ingest(str(tiny_dir), str(tmp_path / "s"))
    store = Store(str(tmp_path / "s"))
    store.connect().close()  # the first connection writes the views database (Store.views_db) ...
    assert os.path.exists(store.views_db())
    new = store.connect()  # ... which a later one attaches
    assert new.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = 'tracekit_views'").fetchall() == [(1,)]
    old = duckdb.connect()
    for table in TABLES:
        create_table_view(old, f"_{table}", store.files(table), TABLES[table])
    for stmt in devices.macros_sql():
        old.execute(stmt)
    old.execute(_VIEWS_SQL)
    views = [r[0] for r in old.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
    assert {"events", "kernels", "gpu_ops", "steps", "ranks", "memory"} <= set(views)
    for v in views:
        assert new.execute(f"DESCRIBE {v}").fetchall() == old.execute(f"DESCRIBE {v}").fetchall(), v
        q = f"SELECT * FROM {v} ORDER BY ALL"
        assert new.execute(q).fetchall() == old.execute(q).fetchall(), v


def test_views_database_is_rewritten_when_unreadable_and_callers_create_in_their_own(tiny_dir, tmp_path):
    """A views database cut short (or another DuckDB's) is written again; what a caller creates goes to the
    connection's own database, never to the attached, read-only views; the sandbox holds."""
    ingest(str(tiny_dir), str(tmp_path / "s"))
    store = Store(str(tmp_path / "s"))
    store.connect().close()
    path = store.views_db()
    with open(path, "r+b") as f:
        f.truncate(100)
    con = store.connect()
    assert con.execute("SELECT count(*) FROM steps").fetchall() == [(4,)]
    assert os.path.getsize(path) > 100
    con.execute("CREATE TABLE mine AS SELECT * FROM steps")
    con.execute("CREATE OR REPLACE TEMP VIEW kernels2 AS SELECT * FROM kernels")
    assert con.execute("SELECT database_name FROM duckdb_tables() WHERE table_name = 'mine'").fetchall() == [("memory",)]
    with pytest.raises(duckdb.Error):
        con.execute("CREATE TABLE tracekit_views.main.x AS SELECT 1")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM read_csv('/etc/passwd')")
    # a new ingest commits new contents: the views of the old ones are never attached again
    write_trace(tiny_dir / "rank1.trace.json", tiny_events(3, t0_us=1005.0), rank=1, world_size=2)
    ingest(str(tiny_dir), str(tmp_path / "s"))
    fresh = Store(str(tmp_path / "s"))
    assert fresh.views_db() != path and fresh.connect().execute("SELECT count(*) FROM steps").fetchall() == [(5,)]
