"""Write a re-timed (predicted) run as a store in the same schema as a measured run.

The replay engine decides new start times and durations for the events of a
measured store; `write_retimed_store` turns those into a complete store that
`tracekit.store.Store`, `tracekit.run.Run`, every view, analysis, diff, report
and gate read exactly as they read an ingested one. Only the manifest tells the
two apart: a replayed store carries a `label` (``Store(out).manifest.label``),
``{"kind": "replay", "source_store": ..., ...}``.

What is re-timed and what is copied, per table (schema.TABLES):

    events          ts_ns / dur_ns from `times`; every other column copied
    steps           recomputed from the re-timed events (the ingest's definition)
    flows           start_ts_ns / end_ts_ns of the re-timed start / end events
    memory          ts_ns of the re-timed [memory] event
    ranks           first_ts_ns, last_end_ns, event_count recomputed; the rest copied
    gpu_args,       copied byte for byte (no times in them)
    comm_args
    fr_entries,     copied byte for byte WITH THEIR MEASURED TIMES (the label lists
    nccl_inspector, them under "not_retimed")
    nccl_tests

All of it is DuckDB COPY ... TO parquet from the source files joined with the
registered Arrow table of new times: no per-event Python.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

from tracekit import __version__
from tracekit.errors import StoreError, TracekitError
from tracekit.store import Store, create_table_view, writer_lock
from tracekit.store import commit
from tracekit.store import manifest as _manifest
from tracekit.store.manifest import Manifest
from tracekit.store.schema import STORED_EVENT_COLUMNS, TABLES
from tracekit.store.sql import copy_sql, literal_list
from tracekit.store.steps import steps_query

__all__ = ["write_retimed_store", "is_replay_store", "REPLAY_KIND", "TIMES_COLUMNS"]

REPLAY_KIND = "replay"
TIMES_COLUMNS = ("rank", "event_id", "ts_ns", "dur_ns")
# tables whose rows are rewritten from the re-timed events; every other table is copied as it is
_RETIMED = ("events", "ranks", "steps", "flows", "memory")
# side inputs whose own times are measured ones and stay so in a replayed store
_NOT_RETIMED = ("fr_entries", "nccl_inspector", "nccl_tests")


def write_retimed_store(src_store_dir: str, out_dir: str, times, *, label: dict, ranks=None) -> str:
    """Write the run of `src_store_dir` with new event times as a store at `out_dir`; return its path.

    ranks: write only these ranks' sources (and the run's own, rank -1: run.json, nccl-tests); default every
    rank. A folded replay has times for its representatives only, and writing the thousands of ranks folded
    into them (with their measured times) cost a 1,024-rank what-if 17 s of its 40.

    times: a pyarrow Table or pandas DataFrame with int64 columns
        rank, event_id   an event of the source store (`_events`: rank, event_id)
        ts_ns            its new start (absolute ns, same clock as the source)
        dur_ns           its new duration; NULL (or the column left out) keeps the source
                         duration, which is NULL for events without one (instants, flows, ...)
    Events absent from `times` (and rows whose ts_ns is NULL) keep their source times;
    the engine normally gives every event. A row naming no event of the source, a
    repeated (rank, event_id) or a negative duration is refused.

    label: a JSON object recorded in the manifest (``Store(out).manifest.label``); its
    "kind" is "replay" (set when absent). "source_store", "tool_version" and
    "not_retimed" (side tables copied with their measured times) are filled in unless given.

    out_dir must be absent, empty, or a previous replay store (which is then replaced
    atomically: new files under fresh names, then the manifest switch, then the old
    files removed). Anything else is refused. A new store is built beside out_dir and
    renamed into place, so out_dir never holds a half-written store; the source store
    is only read. Both go through the store's one commit path (tracekit.store.commit).
    """
    import duckdb

    src = Store(src_store_dir)
    out = os.path.abspath(os.fspath(out_dir))
    if _inside(out, src.path) or _inside(src.path, out):
        raise TracekitError(f"{out}: the replayed store cannot be written over or inside its source store "
                            f"{src.path} (nor the source inside it); choose another directory")
    full_label = _full_label(label, src)
    tbl = _times_table(times)
    mode = _out_mode(out)

    con = duckdb.connect(config={"threads": min(os.cpu_count() or 1, 8), "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.register("_times", tbl)
        create_table_view(con, "_src_events", src.files("events"), TABLES["events"])
        _check_times(con, out)
        keep = None if ranks is None else {int(r) for r in ranks}
        build = lambda staging: _build(con, src, staging, full_label, tbl, keep)  # noqa: E731
        if mode == "replace":
            with writer_lock(out):
                if _out_mode(out) != "replace":  # changed while we waited for the lock
                    raise TracekitError(f"{out}: changed while waiting to write; run the replay again")
                commit.rewrite(out, build)
        else:
            with commit.new_store(out) as fresh:
                commit.rewrite(fresh, build)
    except duckdb.Error as e:
        raise TracekitError(f"{out}: writing the replayed store failed: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise StoreError(f"{out}: writing the replayed store failed ({e.strerror or e})") from None
    finally:
        con.close()
    return out


def is_replay_store(path: str) -> bool:
    """True when `path` holds a committed store whose manifest says it is a replayed run."""
    try:
        m = _manifest.load(os.fspath(path))
    except StoreError:
        return False
    return m is not None and isinstance(m.label, dict) and m.label.get("kind") == REPLAY_KIND


# ---------------------------------------------------------------------------------------------- checks

def _inside(path: str, top: str) -> bool:
    path, top = os.path.realpath(path), os.path.realpath(top)
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _out_mode(out: str) -> str:
    """'fresh' (absent or empty) or 'replace' (a replay store); anything else is refused."""
    if not os.path.lexists(out):
        return "fresh"
    if not os.path.isdir(out):
        raise TracekitError(f"{out}: exists and is not a directory; refusing to write a replayed store there")
    try:
        entries = os.listdir(out)
    except OSError as e:
        raise StoreError(f"{out}: cannot read the directory ({e.strerror})") from None
    if not entries:
        return "fresh"
    if is_replay_store(out):
        return "replace"
    raise TracekitError(f"{out}: not empty and not a replay store; refusing to write a replayed run over it "
                        "(choose a new or empty directory, or a previous replay's output)")


def _full_label(label: dict, src: Store) -> dict:
    if not isinstance(label, dict):
        raise TracekitError(f"label must be a dict (a JSON object), not {type(label).__name__}")
    kind = label.get("kind", REPLAY_KIND)
    if kind != REPLAY_KIND:
        raise TracekitError(f"label kind {kind!r}: a replayed store's label has kind {REPLAY_KIND!r}")
    present = [t for t in _NOT_RETIMED if src.files(t)]
    full = {"kind": REPLAY_KIND, "source_store": src.path, "tool_version": __version__,
            "source_label": src.manifest.label, "not_retimed": present}
    if present:
        full["note"] = (f"{', '.join(present)} are copied from the source store with their measured times; "
                        "only events and the tables derived from them are re-timed")
    full.update(label)
    full["kind"] = REPLAY_KIND
    try:
        json.dumps(full, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TracekitError(f"label must be JSON-serialisable ({e})") from None
    return full


def _times_table(times):
    """`times` -> a pyarrow Table of exactly TIMES_COLUMNS, all int64."""
    import pyarrow as pa

    if not isinstance(times, pa.Table):
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is a dependency
            pd = None
        if pd is not None and isinstance(times, pd.DataFrame):
            times = pa.Table.from_pandas(times, preserve_index=False)
        else:
            raise TracekitError(f"times must be a pyarrow Table or a pandas DataFrame, not {type(times).__name__}")
    names = set(times.column_names)
    missing = [c for c in TIMES_COLUMNS if c not in names and c != "dur_ns"]
    if missing:
        raise TracekitError(f"times lacks column(s) {', '.join(missing)}; it needs {', '.join(TIMES_COLUMNS)}")
    cols = []
    for c in TIMES_COLUMNS:
        col = times.column(c) if c in names else pa.nulls(times.num_rows, pa.int64())
        if pa.types.is_floating(col.type):
            import pyarrow.compute as pc

            big = pc.max(pc.abs(col)).as_py()
            if big is not None and not big < 2**53:  # a double above 2^53 has already lost nanoseconds
                raise TracekitError(f"times.{c} is {col.type} with values up to {big:.6g}: a double holds such "
                                    "nanoseconds only to the nearest few hundred; give int64 nanoseconds")
        try:
            col = col.cast(pa.int64())  # safe: a fractional or overflowing value is an error
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TracekitError(f"times.{c} must be int64 nanoseconds ({e})") from None
        cols.append(col)
    return pa.table(dict(zip(TIMES_COLUMNS, cols)))


def _check_times(con, out: str) -> None:
    nulls, negative, repeated = con.execute("""
        SELECT count(*) FILTER (WHERE rank IS NULL OR event_id IS NULL), count(*) FILTER (WHERE dur_ns < 0),
               count(*) FILTER (WHERE rank IS NOT NULL AND event_id IS NOT NULL)
                 - count(DISTINCT (rank, event_id)) FILTER (WHERE rank IS NOT NULL AND event_id IS NOT NULL)
        FROM _times""").fetchall()[0]
    unknown, example = con.execute("""
        SELECT count(*), any_value([t.rank, t.event_id]) FROM _times t
        ANTI JOIN _src_events e ON e.rank = t.rank AND e.event_id = t.event_id
        WHERE t.rank IS NOT NULL AND t.event_id IS NOT NULL""").fetchall()[0]
    problems = []
    if nulls:
        problems.append(f"{nulls} row(s) without rank or event_id")
    if negative:
        problems.append(f"{negative} negative dur_ns")
    if repeated:
        problems.append(f"{repeated} repeated row(s): a (rank, event_id) given more than once")
    if unknown:
        problems.append(f"{unknown} row(s) naming no event of the source store (e.g. rank {example[0]}, "
                        f"event_id {example[1]})")
    if problems:
        raise TracekitError(f"{out}: not written: in times, " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------- writing

def _files_sql(paths: list[str]) -> str:
    return f"read_parquet({literal_list(paths)}, hive_partitioning = false)"


def _cast_cols(table: str, expr: dict[str, str] | None = None) -> str:
    expr = expr or {}
    return ", ".join(f"CAST({expr.get(c, c)} AS {t}) AS {c}" for c, t, _ in TABLES[table])


def _copy(cur, select: str, target: str, params=None) -> None:
    sql = copy_sql(select, target)
    cur.execute(sql, params) if params is not None else cur.execute(sql)


def _build(con, src: Store, staging: str, label: dict, times, keep: set | None = None) -> tuple[Manifest, dict]:
    """Write every table of every source (of the ranks in `keep`, and the run's own, when given) under `staging`
    (commit.rewrite moves them to their final names); return the manifest to commit and, per source, (rank,
    table -> staged paths)."""
    m = src.manifest
    sources = {}
    staged = {}
    jobs = []
    for k, source in enumerate(sorted(m.sources)):
        entry = m.sources[source]
        if keep is not None and entry.rank is not None and int(entry.rank) >= 0 and int(entry.rank) not in keep:
            continue
        files: dict[str, list[str]] = {}
        for table in TABLES:
            old = entry.files.get(table, [])
            n = 1 if entry.kind == "trace" and table in _RETIMED and old else len(old)
            files[table] = [os.path.join(staging, str(k), table, f"{i}.parquet") for i in range(n)]
            if n:
                os.makedirs(os.path.join(staging, str(k), table), exist_ok=True)
        sources[source] = dataclasses.replace(entry, files={})
        staged[source] = (entry.rank, files)
        jobs.append((entry, files))

    def one(job) -> None:
        entry, files = job
        cur = con.cursor()  # a cursor is its own connection: the Arrow table is registered on each
        try:
            cur.register("_times", times)
            _write_source(cur, src, entry, files)
        finally:
            cur.close()

    # sources side by side (each COPY also uses DuckDB's threads); a lone big rank gets them all
    workers = max(1, min(2, len(jobs), os.cpu_count() or 1))
    if workers == 1:
        for job in jobs:
            one(job)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracekit-replay-write") as pool:
            for f in [pool.submit(one, job) for job in jobs]:
                f.result()
    return Manifest(trace_dir=m.trace_dir, sources=sources, skipped=dict(m.skipped), label=label), staged


def _write_source(cur, src: Store, entry, files: dict[str, list[str]]) -> None:
    """One source's tables into `files` (table -> the paths to write)."""
    abs_src = lambda table: [os.path.join(src.path, p) for p in entry.files.get(table, [])]  # noqa: E731
    for table, rels in files.items():  # copied tables: the bytes as they are
        if entry.kind == "trace" and table in _RETIMED:
            continue
        for old, new in zip(abs_src(table), rels):
            shutil.copyfile(old, new)
    if entry.kind != "trace" or not files.get("events"):
        return
    r = int(entry.rank)
    new_events = files["events"][0]
    ev_cols = ", ".join(
        f"CAST(coalesce(t.{c}, e.{c}) AS BIGINT) AS {c}" if c in ("ts_ns", "dur_ns") else f"e.{c}"
        for c, _t, _ in STORED_EVENT_COLUMNS)
    _copy(cur, f"""
        SELECT {ev_cols}
        FROM {_files_sql(abs_src("events"))} e
        LEFT JOIN (SELECT event_id, ts_ns, dur_ns FROM _times WHERE rank = {r}) t ON t.event_id = e.event_id""",
          new_events)  # no ORDER BY: row order means nothing to a reader, and sorting wide rows is a third of the time
    ev = _files_sql([new_events])

    if files.get("steps"):
        # the ingest's definition (tracekit.store.steps.steps_query) on the re-timed events;
        # tests/test_replay_chrome.py checks that ingesting the written-out traces gives the same rows
        _copy(cur, f"SELECT {_cast_cols('steps')} FROM ({steps_query(ev)})", files["steps"][0])

    if files.get("flows"):
        _copy(cur, f"""
            SELECT {_cast_cols("flows", {"start_ts_ns": "s.ts_ns", "end_ts_ns": "e.ts_ns"})}
            FROM {_files_sql(abs_src("flows"))} f
            LEFT JOIN (SELECT event_id, ts_ns FROM {ev} WHERE ph IN ('s', 'f')) s ON s.event_id = f.start_event_id
            LEFT JOIN (SELECT event_id, ts_ns FROM {ev} WHERE ph IN ('s', 'f')) e ON e.event_id = f.end_event_id
            ORDER BY coalesce(f.start_event_id, f.end_event_id)""", files["flows"][0])

    if files.get("memory"):
        _copy(cur, f"""
            SELECT {_cast_cols("memory", {"ts_ns": "e.ts_ns", "event_id": "m.event_id"})}
            FROM {_files_sql(abs_src("memory"))} m
            JOIN (SELECT event_id, ts_ns FROM {ev} WHERE ph = 'i') e ON e.event_id = m.event_id
            ORDER BY e.ts_ns, m.event_id""", files["memory"][0])

    if files.get("ranks"):
        span = f"(SELECT count(*) AS n, min(ts_ns) AS t0, max(ts_ns + coalesce(dur_ns, 0)) AS t1 FROM {ev})"
        _copy(cur, f"""
            SELECT {_cast_cols("ranks", {"event_count": "span.n", "first_ts_ns": "span.t0", "last_end_ns": "span.t1"})}
            FROM {_files_sql(abs_src("ranks"))} r, {span} span""", files["ranks"][0])
