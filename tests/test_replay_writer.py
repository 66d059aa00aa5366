"""replay.writer: a re-timed run written as a store in the measured schema.

A known transform (rank 1 shifted by +5 ms, every cpu_op twice as long; on GPU traces
the GPU ops moved and stretched) is written, then read back through Store / Run, every
view, an analysis and the comms views, and compared with the source column by column.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import tracekit
from replay.writer import is_replay_store, write_retimed_store
from tracekit.errors import TracekitError
from tracekit.run import Run
from tracekit.store import Store, create_table_view
from tracekit.store.schema import SCHEMA_VERSION, TABLES

from .conftest import REPO, shared_trace_dir

SAMPLE = REPO / "sample_traces" / "ddp4_loopback"
SHIFT_NS = 5_000_000  # rank 1, every event
VIEWS = ("events", "cpu_ops", "runtime", "gpu_ops", "kernels", "steps", "flows", "memory", "ranks", "gpu_args",
         "comm_args", "fr_entries")

# rank 1 starts 5 ms later; every cpu_op (ph X) lasts twice as long
TRANSFORM = f"""
    SELECT rank, event_id,
           ts_ns + CASE WHEN rank = 1 THEN {SHIFT_NS} ELSE 0 END AS ts_ns,
           CASE WHEN ph = 'X' AND cat = 'cpu_op' THEN dur_ns * 2 ELSE dur_ns END AS dur_ns
    FROM _events"""


def _times(store_dir, sql: str = TRANSFORM) -> pa.Table:
    con = Store(store_dir).connect()
    try:
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def _tree_hash(d: Path) -> dict[str, str]:
    """Every file of the store but its cache (what a reader derives and keeps, Store.cache_file: the views
    database any connection writes, the analyses' tables)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file() and p.relative_to(d).parts[0] != "cache"}


def _both(src, out) -> duckdb.DuckDBPyConnection:
    """One connection with a_<table> (source) and b_<table> (replayed) for every stored table."""
    a, b = Store(src), Store(out)
    con = duckdb.connect()
    for t in TABLES:
        create_table_view(con, f"a_{t}", a.files(t), TABLES[t])
        create_table_view(con, f"b_{t}", b.files(t), TABLES[t])
    return con


def _except_both(con, left: str, right: str) -> tuple[int, int]:
    one = con.execute(f"SELECT count(*) FROM ({left} EXCEPT ALL {right})").fetchall()[0][0]
    two = con.execute(f"SELECT count(*) FROM ({right} EXCEPT ALL {left})").fetchall()[0][0]
    return one, two


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("src") / "store"
    tracekit.open(SAMPLE, store=str(store)).close()
    return store


@pytest.fixture(scope="module")
def written(src, tmp_path_factory):
    before = _tree_hash(src)
    out = tmp_path_factory.mktemp("out") / "replayed"
    path = write_retimed_store(str(src), str(out), _times(src),
                               label={"scenario": "rank1 +5ms, cpu_ops x2", "engine": "test"})
    return Path(path), before


def test_the_store_opens_with_the_label(src, written):
    out, _ = written
    s = Store(out)
    assert s.manifest.schema_version == SCHEMA_VERSION
    label = s.manifest.label
    assert label["kind"] == "replay" and label["scenario"] == "rank1 +5ms, cpu_ops x2" and label["engine"] == "test"
    assert label["source_store"] == str(src) and label["tool_version"] == tracekit.__version__
    assert label["not_retimed"] == ["fr_entries"] and "measured times" in label["note"]
    assert json.loads((out / "manifest.json").read_text())["label"] == label
    assert is_replay_store(out) and not is_replay_store(src)
    assert Store(src).manifest.label is None
    assert s.ranks == Store(src).ranks == [0, 1, 2, 3]
    # every table file sits where a measured store keeps it
    for table in TABLES:
        for f in s.manifest.files(table):
            assert f.startswith(f"{table}{os.sep}rank=") and f.endswith(".parquet")


def test_every_view_answers_with_the_source_counts(src, written):
    out, _ = written
    with Run(Store(src)) as a, Run(Store(out)) as b:
        for view in VIEWS:
            n = a.sql(f"SELECT count(*) AS n FROM {view}")["n"][0]
            assert b.sql(f"SELECT count(*) AS n FROM {view}")["n"][0] == n, view
        assert b.sql("SELECT count(*) AS n FROM cpu_ops")["n"][0] > 1000


def test_times_are_the_transform_exactly(src, written):
    out, _ = written
    con = _both(src, out)
    bad = con.execute(f"""
        SELECT count(*) FROM a_events a JOIN b_events b USING (rank, event_id)
        WHERE b.ts_ns IS DISTINCT FROM a.ts_ns + CASE WHEN rank = 1 THEN {SHIFT_NS} ELSE 0 END
           OR b.dur_ns IS DISTINCT FROM CASE WHEN a.ph = 'X' AND a.cat = 'cpu_op' THEN a.dur_ns * 2 ELSE a.dur_ns END
    """).fetchall()[0][0]
    assert bad == 0
    assert con.execute("SELECT count(*) FROM a_events").fetchall() == con.execute("SELECT count(*) FROM b_events").fetchall()


def test_other_columns_are_the_source_ones(src, written):
    out, _ = written
    con = _both(src, out)
    assert _except_both(con, "SELECT * EXCLUDE (ts_ns, dur_ns) FROM a_events",
                        "SELECT * EXCLUDE (ts_ns, dur_ns) FROM b_events") == (0, 0)
    for t in ("gpu_args", "comm_args", "fr_entries", "nccl_tests", "nccl_inspector"):
        assert _except_both(con, f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}") == (0, 0), t
    assert con.execute("SELECT count(*) FROM b_fr_entries").fetchall()[0][0] > 0
    # flows and memory: only their times move
    assert _except_both(con, "SELECT * EXCLUDE (start_ts_ns, end_ts_ns) FROM a_flows",
                        "SELECT * EXCLUDE (start_ts_ns, end_ts_ns) FROM b_flows") == (0, 0)
    assert _except_both(con, "SELECT * EXCLUDE (ts_ns) FROM a_memory", "SELECT * EXCLUDE (ts_ns) FROM b_memory") == (0, 0)
    assert _except_both(con, "SELECT * EXCLUDE (first_ts_ns, last_end_ns, event_count) FROM a_ranks",
                        "SELECT * EXCLUDE (first_ts_ns, last_end_ns, event_count) FROM b_ranks") == (0, 0)


def test_steps_flows_ranks_are_recomputed(src, written):
    out, _ = written
    con = _both(src, out)
    # steps: the re-timed ProfilerStep annotation, found by pid/tid/name/ts in the source events
    steps = con.execute("""
        SELECT s.rank, s.step, s.ts_ns, s.dur_ns, s.end_ns, s.is_last, s.gpu_start_ns, s.gpu_end_ns,
               be.ts_ns AS ev_ts, be.dur_ns AS ev_dur
        FROM b_steps s
        JOIN a_steps a0 ON a0.rank = s.rank AND a0.step = s.step
        JOIN a_events ae ON ae.rank = a0.rank AND ae.pid = a0.pid AND ae.tid = a0.tid AND ae.name = a0.name
                        AND ae.ts_ns = a0.ts_ns AND ae.ph = 'X'
        JOIN b_events be ON be.rank = ae.rank AND be.event_id = ae.event_id""").df()
    assert len(steps) == con.execute("SELECT count(*) FROM a_steps").fetchall()[0][0] == 12
    assert (steps.ts_ns == steps.ev_ts).all() and (steps.dur_ns == steps.ev_dur).all()
    assert (steps.end_ns == steps.ts_ns + steps.dur_ns).all()
    assert steps.gpu_start_ns.isna().all()  # CPU-only sample: no GPU ops
    shifted = con.execute(f"""
        SELECT count(*) FROM a_steps a JOIN b_steps b USING (rank, step)
        WHERE b.ts_ns = a.ts_ns + CASE WHEN rank = 1 THEN {SHIFT_NS} ELSE 0 END AND b.is_last = a.is_last""").fetchall()
    assert shifted[0][0] == 12
    # flows: start/end times are the re-timed s/f events
    bad = con.execute("""
        SELECT count(*) FROM b_flows f
        LEFT JOIN b_events s ON s.rank = f.rank AND s.event_id = f.start_event_id
        LEFT JOIN b_events e ON e.rank = f.rank AND e.event_id = f.end_event_id
        WHERE f.start_ts_ns IS DISTINCT FROM s.ts_ns OR f.end_ts_ns IS DISTINCT FROM e.ts_ns""").fetchall()[0][0]
    assert bad == 0
    # ranks: the span of the re-timed events
    bad = con.execute("""
        SELECT count(*) FROM b_ranks r JOIN (
          SELECT rank, count(*) AS n, min(ts_ns) AS t0, max(ts_ns + coalesce(dur_ns, 0)) AS t1 FROM b_events GROUP BY rank
        ) e USING (rank)
        WHERE r.event_count <> e.n OR r.first_ts_ns <> e.t0 OR r.last_end_ns <> e.t1""").fetchall()[0][0]
    assert bad == 0
    r1 = con.execute("SELECT a.first_ts_ns, b.first_ts_ns FROM a_ranks a JOIN b_ranks b USING (rank) WHERE rank = 1").fetchall()
    assert r1[0][1] == r1[0][0] + SHIFT_NS


def test_analyses_and_comms_run_on_it(written):
    out, _ = written
    with Run(Store(out)) as run:
        tb = run.analyze("temporal_breakdown")
        assert len(tb) > 0
        from analyses import comms

        comms.prepare_views(run)
        matched = run.sql("SELECT * FROM _comm_matched")
        assert len(matched) > 0
        steps = run.sql("SELECT rank, count(*) AS n FROM steps GROUP BY rank ORDER BY rank")
        assert steps["n"].tolist() == [3, 3, 3, 3]
        # rank 1 arrives 5 ms late in every step's first collective on the CPU side: the skew shows it
        ops = run.sql("SELECT rank, min(ts_ns) AS t0 FROM cpu_ops GROUP BY rank ORDER BY rank")
        assert len(ops) == 4


def test_source_store_is_untouched(src, written):
    _, before = written
    write_retimed_store(str(src), str(src.parent / "again"), _times(src), label={})
    assert _tree_hash(src) == before


def test_writing_twice_replaces_the_previous_replay(src, tmp_path):
    out = tmp_path / "r"
    write_retimed_store(str(src), str(out), _times(src), label={"scenario": "first"})
    first = set(Store(out).manifest.files("events"))
    identity = _times(src, "SELECT rank, event_id, ts_ns, dur_ns FROM _events")
    write_retimed_store(str(src), str(out), identity, label={"scenario": "second"})
    s = Store(out)
    assert s.manifest.label["scenario"] == "second"
    assert not first & set(s.manifest.files("events"))
    # no file of the first replay is left, and no work folder
    named = {os.path.normpath(p) for t in TABLES for p in s.manifest.files(t)}
    on_disk = {os.path.normpath(str(p.relative_to(out))) for p in out.rglob("*.parquet")}
    assert on_disk == named
    assert not (out / "staging").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftover build folder beside it
    # identity times: every table is the source's, row for row
    con = _both(src, out)
    for t in TABLES:
        assert _except_both(con, f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}") == (0, 0), t


def test_an_empty_directory_is_used(src, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    write_retimed_store(str(src), str(out), _times(src), label={})
    assert is_replay_store(out)


def test_a_foreign_directory_is_refused(src, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    with pytest.raises(TracekitError) as e:
        write_retimed_store(str(src), str(d), _times(src), label={})
    msg = str(e.value)
    assert str(d) in msg and "not a replay store" in msg and "\n" not in msg
    assert [p.name for p in d.iterdir()] == ["notes.txt"]
    # a measured store is not overwritten either, nor the source itself, nor a file
    other = tmp_path / "measured"
    tracekit.open(SAMPLE, store=str(other)).close()
    with pytest.raises(TracekitError, match="not a replay store"):
        write_retimed_store(str(src), str(other), _times(src), label={})
    with pytest.raises(TracekitError, match="source store"):
        write_retimed_store(str(src), str(src), _times(src), label={})
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TracekitError, match="not a directory"):
        write_retimed_store(str(src), str(f), _times(src), label={})


def test_bad_times_are_refused_and_nothing_is_written(src, tmp_path):
    out = tmp_path / "bad"
    t = _times(src).to_pandas()
    dup = pd.concat([t, t.head(1)])
    with pytest.raises(TracekitError, match="more than once"):
        write_retimed_store(str(src), str(out), dup, label={})
    ghost = t.copy()
    ghost.loc[0, "event_id"] = 10**9
    with pytest.raises(TracekitError, match="naming no event"):
        write_retimed_store(str(src), str(out), ghost, label={})
    neg = t.copy()
    neg.loc[neg["dur_ns"].notna().idxmax(), "dur_ns"] = -1
    with pytest.raises(TracekitError, match="negative dur_ns"):
        write_retimed_store(str(src), str(out), neg, label={})
    nulls = t.copy()
    nulls["rank"] = nulls["rank"].astype("Int64")
    nulls.loc[0, "rank"] = pd.NA
    with pytest.raises(TracekitError, match="without rank or event_id"):
        write_retimed_store(str(src), str(out), nulls, label={})
    with pytest.raises(TracekitError, match="int64"):
        write_retimed_store(str(src), str(out), t.assign(ts_ns=t["ts_ns"] + 0.5), label={})
    with pytest.raises(TracekitError, match="lacks column"):
        write_retimed_store(str(src), str(out), t.drop(columns=["ts_ns"]), label={})
    with pytest.raises(TracekitError, match="kind"):
        write_retimed_store(str(src), str(out), t, label={"kind": "measured"})
    with pytest.raises(TracekitError, match="JSON"):
        write_retimed_store(str(src), str(out), t, label={"x": object()})
    assert not out.exists()


def test_pandas_times_and_absent_events_keep_their_times(src, tmp_path):
    """A DataFrame with nullable durations; events left out, or with NULL times, keep the source's."""
    t = _times(src).to_pandas()
    assert str(t["dur_ns"].dtype) in ("Int64", "float64", "int64")
    t["dur_ns"] = t["dur_ns"].astype("Int64")
    keep = t[t["rank"] != 2].copy()  # rank 2 not given at all
    keep.loc[keep["rank"] == 3, "dur_ns"] = pd.NA  # rank 3: new starts, durations kept
    out = write_retimed_store(str(src), str(tmp_path / "p"), keep, label={})
    con = _both(src, out)
    bad = con.execute(f"""
        SELECT count(*) FROM a_events a JOIN b_events b USING (rank, event_id)
        WHERE (rank = 2 AND (b.ts_ns IS DISTINCT FROM a.ts_ns OR b.dur_ns IS DISTINCT FROM a.dur_ns))
           OR (rank = 3 AND b.dur_ns IS DISTINCT FROM a.dur_ns)
           OR (rank = 1 AND b.ts_ns IS DISTINCT FROM a.ts_ns + {SHIFT_NS})""").fetchall()[0][0]
    assert bad == 0


def _gpu_transform(delay_ns: int) -> str:
    """GPU ops start delay_ns later and kernels last twice as long; everything else stays."""
    return f"""
        SELECT rank, event_id,
               ts_ns + CASE WHEN ph = 'X' AND cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') THEN {delay_ns} ELSE 0 END
                 AS ts_ns,
               CASE WHEN ph = 'X' AND cat = 'kernel' THEN dur_ns * 2 ELSE dur_ns END AS dur_ns
        FROM _events"""


def _expected_gpu_spans(run: Run) -> pd.DataFrame:
    """The steps' GPU spans computed here from the views: GPU ops whose launching runtime
    call starts inside the step, first start / last end."""
    return run.sql("""
        SELECT s.rank, s.step, min(g.ts_ns) AS gpu_start_ns, max(g.ts_ns + g.dur_ns) AS gpu_end_ns
        FROM steps s
        JOIN runtime l ON l.rank = s.rank AND l.ts_ns >= s.ts_ns AND l.ts_ns < s.end_ns AND l.correlation IS NOT NULL
        JOIN gpu_ops g ON g.rank = l.rank AND g.correlation = l.correlation
        GROUP BY ALL ORDER BY s.rank, s.step""")


def test_gpu_steps_memory_and_args_on_a_tiny_trace(tiny_dir, tmp_path):
    src = tmp_path / "tiny-store"
    tracekit.open(tiny_dir, store=str(src)).close()
    out = write_retimed_store(str(src), str(tmp_path / "tiny-replay"), _times(src, _gpu_transform(7_000)),
                              label={"scenario": "gpu late"})
    con = _both(src, out)
    for t in ("gpu_args", "comm_args"):
        assert _except_both(con, f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}") == (0, 0)
    assert con.execute("SELECT count(*) FROM b_gpu_args").fetchall()[0][0] > 0
    with Run(Store(src)) as a, Run(Store(out)) as b:
        before, after = a.sql("SELECT * FROM steps ORDER BY rank, step"), b.sql("SELECT * FROM steps ORDER BY rank, step")
        assert after["gpu_start_ns"].notna().all() and len(after) == 4
        assert (after["gpu_start_ns"] == before["gpu_start_ns"] + 7_000).all()
        assert (after["gpu_end_ns"] != before["gpu_end_ns"]).all()
        spans = _expected_gpu_spans(b)
        assert after[["rank", "step", "gpu_start_ns", "gpu_end_ns"]].reset_index(drop=True).equals(spans)
        assert (after[["ts_ns", "dur_ns", "end_ns", "is_last"]] == before[["ts_ns", "dur_ns", "end_ns", "is_last"]]).all().all()
        # memory keeps its rows; kernels are twice as long
        assert b.sql("SELECT count(*) AS n FROM memory")["n"][0] == a.sql("SELECT count(*) AS n FROM memory")["n"][0] > 0
        k = b.sql("SELECT sum(dur_ns) AS d FROM kernels")["d"][0]
        assert k == 2 * a.sql("SELECT sum(dur_ns) AS d FROM kernels")["d"][0]
        assert len(b.analyze("kernel_breakdown")) > 0


@pytest.mark.slow  # a shared GPU trace
def test_gpu_trace_from_the_shared_set(tmp_path):
    """A real GPU trace with steps, kernels, collectives: steps' GPU spans, gpu_args, comm_args."""
    d = shared_trace_dir("hta/nccl_parser_config")
    src = tmp_path / "s"
    tracekit.open(d, store=str(src), rank_from="order").close()
    out = write_retimed_store(str(src), str(tmp_path / "r"), _times(src, _gpu_transform(250_000)), label={})
    con = _both(src, out)
    for t in ("gpu_args", "comm_args"):
        assert _except_both(con, f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}") == (0, 0)
    assert con.execute("SELECT count(*) FROM b_comm_args").fetchall()[0][0] > 0
    with Run(Store(out)) as b:
        steps = b.sql("SELECT rank, step, gpu_start_ns, gpu_end_ns FROM steps ORDER BY rank, step")
        assert steps["gpu_start_ns"].notna().all() and len(steps) > 0
        assert steps.reset_index(drop=True).equals(_expected_gpu_spans(b))
        assert len(b.analyze("temporal_breakdown")) > 0
    # identity: every table comes back exactly
    out2 = write_retimed_store(str(src), str(tmp_path / "id"), _times(src, "SELECT rank, event_id, ts_ns, dur_ns FROM _events"),
                               label={})
    con = _both(src, out2)
    for t in TABLES:
        assert _except_both(con, f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}") == (0, 0), t


def test_a_failed_write_leaves_the_previous_replay_and_no_debris(src, tmp_path, monkeypatch):
    import replay.writer as writer

    out = tmp_path / "r"
    write_retimed_store(str(src), str(out), _times(src), label={"scenario": "kept"})
    before = _tree_hash(out)
    calls = []
    real = writer._write_source

    def failing(cur, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(cur, *a, **k)

    monkeypatch.setattr(writer, "_write_source", failing)
    with pytest.raises(TracekitError, match="No space left"):
        write_retimed_store(str(src), str(out), _times(src), label={"scenario": "lost"})
    after = _tree_hash(out)
    assert {k: v for k, v in after.items() if k != "lock"} == {k: v for k, v in before.items() if k != "lock"}
    assert Store(out).manifest.label["scenario"] == "kept"
    calls.clear()
    with pytest.raises(TracekitError, match="No space left"):
        write_retimed_store(str(src), str(tmp_path / "fresh"), _times(src), label={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # neither the store nor its build folder


def test_a_failed_manifest_switch_removes_the_moved_files(src, tmp_path, monkeypatch):
    """The writer commits through tracekit.store.commit: files moved to their final names before a failed
    manifest switch are removed again, and the previous replay is what a reader sees."""
    from tracekit.store import commit

    out = tmp_path / "r"
    write_retimed_store(str(src), str(out), _times(src), label={"scenario": "kept"})
    before = _tree_hash(out)

    def failing(store_dir, manifest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(commit, "switch_manifest", failing)
    with pytest.raises(TracekitError, match="No space left"):
        write_retimed_store(str(src), str(out), _times(src), label={"scenario": "lost"})
    assert {k: v for k, v in _tree_hash(out).items() if k != "lock"} == \
        {k: v for k, v in before.items() if k != "lock"}
    assert not (out / "staging").exists()
    assert Store(out).manifest.label["scenario"] == "kept"


def test_a_directory_filled_while_writing_is_left_alone(src, tmp_path, monkeypatch):
    """A new store is renamed into place only onto an absent or empty directory: one filled meanwhile keeps
    its contents, the error names it, and no build folder is left beside it."""
    from tracekit.store import commit

    out = tmp_path / "new"
    real = commit.rewrite

    def filling(store_dir, build):
        manifest = real(store_dir, build)
        out.mkdir()
        (out / "notes.txt").write_text("keep me")
        return manifest

    monkeypatch.setattr(commit, "rewrite", filling)
    with pytest.raises(TracekitError) as e:
        write_retimed_store(str(src), str(out), _times(src), label={})
    assert str(out) in str(e.value) and "filled meanwhile" in str(e.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
