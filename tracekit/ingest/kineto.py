"""Kineto trace -> Parquet files for one rank (a pure map: one file in, files out).

Owns: decoding events into Arrow columns, the typed-args extraction declared in
`store.schema`, timestamps as exact int64 ns, the rank of a file, and the
per-file derived tables (ranks, steps, flows, memory).

No per-event Python: the reader hands over chunks of complete events as JSON
arrays; the compiled decoder (_events.c) turns each into the typed columns, which
DuckDB writes as Parquet, and DuckDB's vectorised JSON reader with the typed SQL
below does the same for a chunk the decoder declines (the typed-args map, exact
ns timestamps, compact args JSON: both give the same columns).
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import duckdb
import msgspec

from ..errors import TraceFileError
from ..store.devices import DEVICE_OP_CATEGORIES, sql_in
from ..store.schema import ARG_COLUMNS, STORED_EVENT_COLUMNS, TABLES
from ..store.sql import copy_sql, literal, literal_list
from ..store.steps import steps_query
from .reader import CHUNK_BYTES, TraceStream


def _unusable(events) -> str | None:
    """Why the compiled events decoder module `events` (None: not importable) cannot be used, or None. A
    build from an older _events.c (an editable install not rebuilt) gives other columns than the schema's."""
    if events is None:
        return "not built (no C compiler at install?)"
    if events.COLUMNS != tuple(c for c, _, _ in STORED_EVENT_COLUMNS) + ("_deferred",):
        return "built from an older _events.c: its columns are not the schema's (run pip install again)"
    return None


# The compiled events decoder (setup.py builds it at install); without it every run takes DuckDB's JSON
# reader. _EVENTS_UNUSED says why, for decoder_in_use.
try:
    from . import _events
except ImportError:  # built without a C compiler
    _events = None
_EVENTS_UNUSED = _unusable(_events)
if _EVENTS_UNUSED:
    _events = None
# Without the compiled decoder ingest takes this much longer (CPU seconds on bench/ingest.py's trace,
# hta/df_index_resolver: 0.87 s vs 0.47 s); README.md and setup.py say the same.
DUCKDB_PATH_SLOWER = "~1.8x"


_RANK_PATTERNS = (
    re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])(?:rank|worker)(\d+)", re.IGNORECASE),
)


def rank_from_filename(name: str) -> int | None:
    """`rank-3`, `rank3`, `rank_3`, `worker3`, `sampled_rank-0` ... -> the number."""
    for pat in _RANK_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


@dataclass
class FileResult:
    """What ingesting one file produced, before it is committed to the store."""

    source: str  # path relative to the trace directory
    rank: int
    rank_source: str
    staged: dict[str, list[str]]  # table -> staged parquet files
    event_count: int
    lost_event_count: int
    warnings: list[str] = field(default_factory=list)
    world_size: int | None = None


def _group_spec(group: str) -> tuple[str, list[str]]:
    """json_transform's structure for one group of args, and the SELECT items
    that name its fields as columns (struct `_<group>`)."""
    spec: dict[str, str] = {}
    cols = []
    for a in ARG_COLUMNS:
        if a.group == group:
            spec[a.key] = a.sql_type
            cols.append(f'_{group}."{a.key}" AS {a.column}')
    return literal(msgspec.json.encode(spec).decode()), cols


def _us_to_ns(us: str, reading: str = "double") -> str:
    """The SQL that turns microseconds into int64 ns: every ts_ns and dur_ns of ingest comes from here (and
    from _events.c, which gives the same values: its us_to_ns and field_time).

    reading "double": `us` is a DOUBLE (exact to the ns below 2^42 us): whole values scale as integers (exact
    up to 2^53), others give round(us * 1000); NULL beyond int64 ns, and for NaN.
    reading "text": `us` is the number's text: round(DECIMAL(38,6) * 1000), exact for every value Kineto
    writes (the large fractional ts that a double cannot hold to the ns); NULL where that is no number or
    beyond int64 ns.
    """
    if reading == "text":
        return f"TRY_CAST(round(TRY_CAST({us} AS DECIMAL(38,6)) * 1000) AS BIGINT)"
    assert reading == "double", reading
    return (f"CASE WHEN NOT abs({us}) < 9.2e15 THEN NULL "
            f"WHEN {us} = trunc({us}) THEN TRY_CAST({us} AS BIGINT) * 1000 "
            f"ELSE TRY_CAST(round({us} * 1000) AS BIGINT) END")


def _typed_sql(exact_ts: bool = False) -> str:
    """SQL from one chunk file of events (a JSON array) to the events schema.

    DuckDB parses the JSON. json_transform parses each args object once into a
    typed struct of the "common" args (bad values become NULL; the original
    stays in args_json); the sparse groups are read from args_json once per
    file, see _derived_tables. Timestamps arrive as DOUBLE, exact to the
    ns below 2^42 us; larger fractional ones (old-style absolute times) come
    exactly from the text through the `ts_text` table, see _exact_ts.

    exact_ts: read ts as JSON and scale its text as an exact decimal (the same
    value _exact_ts gives, without decoding the chunk twice). DuckDB writes a
    number back as the shortest text that reads as the same double, which is the
    trace's own text for ts with at most 3 decimals below 2^43 us (every such
    value has a double of its own); _write_events sends other chunks to
    _exact_ts. A ts that the DOUBLE reading would refuse raises, so that the
    caller falls back to the path whose error names the event.
    """
    spec, cols = _group_spec("common")
    transforms = (f"CASE WHEN ph <> 'M' AND name IS DISTINCT FROM '[memory]' "
                  f"THEN json_transform(args, {spec}) END AS _common")
    # pid/tid/id are integers except in a few events (Kineto's "Spans" rows):
    # read as text, keep the integer when there is one, else the label.
    columns = ("{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
               f"ts: '{'JSON' if exact_ts else 'DOUBLE'}', "
               "dur: 'DOUBLE', id: 'VARCHAR', bp: 'VARCHAR', s: 'VARCHAR', args: 'JSON'}")
    # An integer only when it prints back as the same text: TRY_CAST alone would
    # also read '0x1f' or ' 7' as integers (cheaper than a regular expression).
    as_int = lambda c: f"CASE WHEN TRY_CAST({c} AS BIGINT)::VARCHAR = {c} THEN TRY_CAST({c} AS BIGINT) END"  # noqa: E731
    label = lambda c: f"CASE WHEN TRY_CAST({c} AS BIGINT)::VARCHAR IS DISTINCT FROM {c} THEN {c} END"  # noqa: E731
    return f"""
    WITH r AS (
      SELECT ordinality - 1 + $first_id AS event_id, *
      FROM read_json($path, format = 'array', columns = {columns}, maximum_object_size = $max_object) WITH ORDINALITY),
    b AS (
      SELECT *,
        {transforms}
      FROM r)
    SELECT event_id, ph, cat, name,
      {as_int("pid")} AS pid, {as_int("tid")} AS tid,
      {label("pid")} AS pid_label, {label("tid")} AS tid_label,
      {_exact_ts_sql() if exact_ts else _us_to_ns("ts")} + $base AS ts_ns,
      {_us_to_ns("dur")} AS dur_ns,
      {as_int("id")} AS flow_id, {label("id")} AS flow_id_label,
      bp, s AS scope,
      {", ".join(cols)},
      args::VARCHAR AS args_json
    FROM b"""


def _exact_ts_sql() -> str:
    # as _exact_ts: TRY_CAST of the number's text (a JSON string keeps its quotes: NULL, as there)
    return ("CASE WHEN json_type(ts) IN ('OBJECT', 'ARRAY') OR (json_type(ts) = 'VARCHAR' AND "
            "TRY_CAST(json_extract_string(ts, '$') AS DOUBLE) IS NULL) THEN error('ts is not a number') "
            f"ELSE {_us_to_ns('ts::VARCHAR', 'text')} END")


_TYPED_SQL = _typed_sql()
_TYPED_SQL_EXACT_TS = _typed_sql(exact_ts=True)
# A fractional timestamp too large for a double to hold to the ns.
_BIG_FRACTIONAL_TS = re.compile(rb'"ts"\s*:\s*-?\d{13,}\.\d')
# ... and one whose text a double cannot give back: over 3 decimals, or 2^43 us (8.8e12) and beyond
# (conservatively: 13 digits starting with 8 or 9, or more digits).
_TS_TEXT_NEEDED = re.compile(rb'"ts"\s*:\s*-?(?:\d{14,}\.\d|[89]\d{12}\.\d|\d{13}\.\d{4})')


class _TsOnly(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"")


_TS_DECODER = msgspec.json.Decoder(list[_TsOnly])


def _exact_ts(con, text: bytes, first_id: int, base: int, rel: "duckdb.DuckDBPyRelation"):
    """Replace ts_ns with values parsed from the JSON text as exact decimals."""
    import pyarrow as pa  # only here: importing pyarrow costs ~40 MB of RSS in every worker

    raws = [bytes(e.ts) for e in _TS_DECODER.decode(text)]
    ts_text = pa.table({"event_id": pa.array(range(first_id, first_id + len(raws)), pa.int64()),  # noqa: F841
                        "ts_raw": pa.array(raws, pa.binary()).cast(pa.string())})
    return con.sql(
        f"SELECT e.* REPLACE ({_us_to_ns('t.ts_raw', 'text')} + "
        f"{int(base)} AS ts_ns) FROM rel e JOIN ts_text t USING (event_id) ORDER BY event_id")


class _Prefetch:
    """Run the reader (gunzip, cutting) in a thread while DuckDB, which releases
    the GIL, converts the previous chunk: the two cores work at once. The thread
    starts at once, so that it reads the first run while the caller opens its
    database; close() stops it, iterated or not."""

    _DONE = object()

    def __init__(self, batches, depth: int = 1):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._produce, args=(batches,), name="tracekit-reader", daemon=True)
        self._t.start()

    def _produce(self, batches) -> None:
        try:
            for item in batches:
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._q.put(self._DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._q.put(e)

    def __iter__(self):
        while True:
            item = self._q.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._t.is_alive():  # a producer blocked on a full queue sees the stop within 0.1 s
            self._t.join(0.1)
            try:
                self._q.get_nowait()
            except queue.Empty:
                pass


_CONVERT_MEMORY = "1GB"


def _connect(threads: int = 1):
    # A thread per converter: DuckDB reads one small JSON chunk on one thread,
    # and more threads only add per-thread buffers.
    con = duckdb.connect(config={"threads": threads, "memory_limit": _CONVERT_MEMORY})
    # Hand freed memory back to the OS soon: DuckDB's allocator otherwise keeps
    # up to 128 MB of per-thread caches, which is most of an ingest's peak RSS.
    con.execute("SET allocator_flush_threshold = '8MB'")
    con.execute("SET allocator_bulk_deallocation_flush_threshold = '8MB'")
    return con


_REUSED: dict[int, Any] = {}


def _reused(threads: int):
    """This process's kept database for `threads` converters, with the conversion settings back."""
    con = _REUSED.get(threads)
    if con is None:
        con = _REUSED[threads] = _connect(threads)
    else:
        con.execute(f"SET memory_limit = '{_CONVERT_MEMORY}'")  # the derived stage lowered it
        con.execute(f"SET threads = {threads}")  # ... and may have changed this
        con.execute("RESET temp_directory")
    return con


def _scratch_dir(stage_dir: str) -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else stage_dir


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    # outside int64 it cannot be stored (BIGINT columns): as unusable as a wrong type
    return v if isinstance(v, int) and -(1 << 63) <= v < (1 << 63) else None


_MAX_OBJECT = 16 << 20
# DuckDB's budget for the per-file derived tables (steps, flows, memory, sparse args): they need the
# whole file, and beyond this DuckDB spills to <stage>/spill. A 54 MB trace stays well under it. On a
# 2 GB trace (bench/big_ingest.py) the derived stage took 17.8 s unbounded (peak 899 MB and growing
# with the file), 18.5 s at 640 MB (peak ~730 MB), 20.8 s at 512 MB, 24.2 s at 320 MB (peak ~430 MB):
# 640 MB keeps nearly the unbounded speed and the ingest under 1 GB whatever the file size.
DERIVED_MEMORY = "640MB"
DERIVED_AT_ONCE = 3  # derived-table queries run side by side
# DuckDB converters per file, beside the reader thread. Two use both cores on a
# lone file but hold one more chunk (~30 MB); the process pool already fills
# the cores when there are several files.
CONVERTERS = 1


def ingest_task(task: dict, **kw) -> FileResult:
    """ingest_kineto for one task of the runner (path, source, stage, rank_from, forced_rank, only_trace):
    the form in which every executor hands a file over."""
    return ingest_kineto(task["path"], task["source"], task["stage"], rank_from=task["rank_from"],
                         forced_rank=task["forced_rank"], only_trace=task["only_trace"], **kw)


def ingest_kineto(path: str, source: str, stage_dir: str, *, rank_from: str = "auto",
                  forced_rank: int | None = None, only_trace: bool = False, chunk_bytes: int = CHUNK_BYTES,
                  converters: int = CONVERTERS, reuse_connection: bool = False) -> FileResult:
    """Read one Kineto trace and write its tables as Parquet under stage_dir.

    only_trace: this is the run's only trace, so with rank_from "auto" a trace that names no rank is
    rank 0 (torch.profiler without a process group; HTA does the same) rather than an error.
    Raises TraceFileError (naming the file) on input that cannot be ingested.
    """
    os.makedirs(stage_dir, exist_ok=True)
    stream = TraceStream(path, chunk_bytes=chunk_bytes, decoder=_decoder())
    reader = _Prefetch(stream.batches())  # reads the first run while the database opens
    try:
        return _convert_file(path, source, stage_dir, stream, reader, rank_from, forced_rank, only_trace,
                             converters, reuse_connection)
    finally:
        reader.close()


def _convert_file(path, source, stage_dir, stream: TraceStream, reader: _Prefetch, rank_from, forced_rank,
                  only_trace, converters, reuse_connection) -> FileResult:
    # Converters: each a DuckDB connection (one thread) and its scratch file.
    # Two run side by side with the reader thread; more would only add memory.
    idle: queue.Queue = queue.Queue()
    scratch_dir = _scratch_dir(stage_dir)
    # one database: a second one costs ~30 MB. A worker process that ingests file after file keeps
    # its database (opening one costs 20-60 ms: a third of a small rank file's whole ingest)
    con = _reused(converters) if reuse_connection else _connect(converters)
    made = []
    for _ in range(converters):
        fd, scratch = tempfile.mkstemp(prefix="tracekit-", suffix=".json", dir=scratch_dir)
        os.close(fd)
        made.append((con.cursor(), scratch))
        idle.put(made[-1])
    parts: list[str] = []
    checks: list[PartChecks | None] = []  # per part, what the decoder gathered for the checks (None: not decoded)
    base = None

    def convert(text: bytes | None, first_id: int, run, target: str) -> tuple[str, PartChecks | None]:
        con, scratch = idle.get()
        try:
            params = {"path": scratch, "first_id": first_id, "base": base, "max_object": _MAX_OBJECT}
            try:
                if run is not None:  # the reader's decoder took it
                    return target, _write_decoded(con, run, target)
                try:
                    _write_events(con, params, text, target)
                except duckdb.Error as e:
                    if "maximum_object_size" not in str(e):
                        raise
                    params["max_object"] = len(text) + 1  # one event over 16 MB: rare, costs memory
                    _write_events(con, params, text, target)
                return target, None
            except duckdb.Error as e:
                raise TraceFileError(path, _event_error(str(e), first_id)) from None
            except UnicodeDecodeError:  # DuckDB's message quoted the event and cut a UTF-8 character in two
                raise TraceFileError(path, f"an event from traceEvents[{first_id}] on could not be read: each event "
                                           "must be a JSON object whose ts and dur are numbers; fix or drop it") from None
        finally:
            idle.put((con, scratch))

    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(max_workers=converters, thread_name_prefix="tracekit-convert") as pool:
            inflight = []
            runs = iter(reader)
            while True:
                if len(inflight) >= converters:  # bounded: at most `converters` runs converting, and the
                    _add(parts, checks, inflight.pop(0).result())  # next one taken only when one is free
                item = next(runs, None)
                if item is None:
                    break
                if base is None:
                    base = _base(stream.head_metadata)
                target = os.path.join(stage_dir, f"events-{len(parts) + len(inflight):06d}.parquet")
                inflight.append(pool.submit(convert, item.text, item.first, item.decoded, target))
                del item
            for fut in inflight:
                _add(parts, checks, fut.result())
        if not parts and stream.broken:
            raise TraceFileError(path, f"{stream.broken}, before any complete event; fix or drop that event, "
                                       "or export the trace again")
        if not parts:
            raise TraceFileError(path, "traceEvents is empty: the profiler recorded nothing; check the "
                                       "profiler schedule (wait/warmup/active) and that profiling ran")
    except MemoryError:
        raise TraceFileError(path, "ran out of memory reading one event; is an event gigabytes long?") from None
    except RecursionError:
        raise TraceFileError(path, "JSON nested too deeply to read (thousands of levels); not a profiler trace?") from None
    finally:
        for c, scratch in made:
            c.close()
            os.unlink(scratch)

    meta = stream.metadata
    events = f"read_parquet({literal_list(parts)})"
    n_events, first_ts, last_end, comm_parts = _run_checks(con, path, parts, checks)
    late_base = _int(meta.get("baseTimeNanoseconds")) if "baseTimeNanoseconds" not in stream.head_metadata else None
    if late_base:  # the base came after traceEvents: shift what was written
        first_ts, last_end = first_ts + late_base if first_ts is not None else None, \
            last_end + late_base if last_end is not None else None
        for part in parts:
            con.execute(copy_sql(f"SELECT * REPLACE (ts_ns + {int(late_base)} AS ts_ns) FROM read_parquet({literal(part)})",
                                 part + ".base"))
            os.replace(part + ".base", part)

    rank, rank_source, world_size = _resolve_rank(path, source, meta, rank_from, forced_rank, only_trace)
    staged = {"events": parts}
    # The derived tables join and aggregate over the whole file (a launch and its kernel can be chunks
    # apart): DuckDB gets a fixed budget and spills the rest to disk, so memory does not grow with the file.
    spill = os.path.join(stage_dir, "spill")
    con.execute(f"SET temp_directory = {literal(spill)}")
    con.execute(f"SET memory_limit = '{DERIVED_MEMORY}'")
    # the derived queries run DERIVED_AT_ONCE side by side: each gets its share of the cores, at most the
    # conversion's threads (on 2 cores, 2 threads each made 6 busy threads: 20% more CPU for the stage)
    con.execute(f"SET threads = {max(1, min(converters, (os.cpu_count() or 1) // DERIVED_AT_ONCE))}")
    try:
        staged.update(_derived_tables(con, stage_dir, events, comm_parts))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    staged["ranks"] = [_write_rank_row(con, stage_dir, (n_events, first_ts, last_end), source, meta, stream,
                                       rank_source, world_size)]
    if not reuse_connection:
        con.close()
    return FileResult(source=source, rank=rank, rank_source=rank_source, staged=staged,
                      event_count=stream.event_count, lost_event_count=stream.lost_events,
                      warnings=list(stream.warnings), world_size=world_size)


_CAST_EVENTS = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t, _ in STORED_EVENT_COLUMNS)


class PartChecks(NamedTuple):
    """What ingest's checks (_run_checks) need from one Parquet part of events: from the compiled decoder
    (its Run.checks), or from one query over the parts it did not decode."""

    rows: int
    first_ts_ns: int | None
    last_end_ns: int | None  # max(ts_ns + coalesce(dur_ns, 0))
    first_untimed_complete: int | None  # the event id of the first ph X event without both ts and dur
    may_hold_comm_args: bool  # some args_json may hold collective metadata (_COMM_ARGS)
    first_overflow: int | None  # the event id of the first event whose ts + dur is beyond int64


def _add(parts: list[str], checks: list, written: tuple[str, PartChecks | None]) -> None:
    parts.append(written[0])
    checks.append(written[1])


def _run_checks(con, path: str, parts: list[str], checks: list[PartChecks | None]):
    """Refuse a file with a complete event that lacks a time or ends beyond int64 ns; else return its event
    count, span (first ts, last end) and the parts that may hold collective args. From what the decoder
    gathered (`checks`, per part), and one query over the parts it did not decode."""
    known = [c for c in checks if c is not None]
    rest = [p for p, c in zip(parts, checks) if c is None]
    if rest:
        rel = f"read_parquet({literal_list(rest)})"
        try:
            known.append(PartChecks(*con.execute(
                f"SELECT count(*), min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)), "
                f"min(event_id) FILTER (WHERE ph = 'X' AND (ts_ns IS NULL OR dur_ns IS NULL)), true, NULL "
                f"FROM {rel}").fetchall()[0]))
        except duckdb.OutOfRangeException:  # some ts + dur beyond int64
            known.append(PartChecks(0, None, None, None, True, con.execute(
                f"SELECT min(event_id) FROM {rel} "
                f"WHERE ts_ns::HUGEINT + dur_ns NOT BETWEEN {-(1 << 63)} AND {(1 << 63) - 1}").fetchall()[0][0]))

    def least(field: str, f):
        vals = [getattr(k, field) for k in known if getattr(k, field) is not None]
        return f(vals) if vals else None

    overflow, bad = least("first_overflow", min), least("first_untimed_complete", min)
    if overflow is not None:
        raise TraceFileError(path, f"traceEvents[{overflow}]: its ts + dur ends beyond what 64-bit nanoseconds hold "
                                   "(292 years); fix or drop that event")
    if bad is not None:
        raise TraceFileError(path, f"traceEvents[{bad}]: a complete event (ph X) needs numeric 'ts' and 'dur'; "
                                   "fix or drop that event")
    comm = [p for p, c in zip(parts, checks) if c is None or c.may_hold_comm_args]
    return sum(k.rows for k in known), least("first_ts_ns", min), least("last_end_ns", max), comm


def _base(head_metadata: dict) -> int:
    """The ns added to every ts: the trace's baseTimeNanoseconds, when it comes before traceEvents."""
    return _int(head_metadata.get("baseTimeNanoseconds")) or 0


def _decode_run(events, first_id: int, head_metadata: dict):
    return _events.decode(events, first_id, _base(head_metadata), True)


def _decoder():
    """The reader's decoder (TraceStream's `decoder`): the compiled one, unless it is not built or
    TRACEKIT_DECODER=duckdb asks for DuckDB's reader on every run."""
    return _decode_run if _events is not None and not _duckdb_asked() else None


def _duckdb_asked() -> bool:
    return os.environ.get("TRACEKIT_DECODER") == "duckdb"


def decoder_in_use() -> str:
    """Which reader turns the events of a trace into columns in this installation (`tracekit info`)."""
    if _events is None:
        return (f"DuckDB's JSON reader: the compiled decoder (tracekit/ingest/_events.c) is {_EVENTS_UNUSED}; "
                f"ingest takes {DUCKDB_PATH_SLOWER} as long without it: install a C compiler (gcc) and run "
                "pip install again")
    if _duckdb_asked():
        return "DuckDB's JSON reader (TRACEKIT_DECODER=duckdb)"
    return "compiled (tracekit/ingest/_events.c; DuckDB's JSON reader for a run it declines)"


def decoder_missing() -> bool:
    """True when ingest reads with DuckDB's JSON reader because the compiled decoder cannot be used (not
    when TRACEKIT_DECODER=duckdb asks for it)."""
    return _events is None


def _write_events(con, params: dict, text: bytes, target: str) -> None:
    """The general path: one run the decoder declined (it names nothing; DuckDB's errors name the event)
    -> the Parquet part `target`."""
    with open(params["path"], "wb") as f:  # DuckDB reads the run from a scratch file
        f.write(text)
    if _BIG_FRACTIONAL_TS.search(text):
        if not _TS_TEXT_NEEDED.search(text):  # the common case (Kineto's relative us, 3 decimals)
            try:
                _copy_events(con, _TYPED_SQL_EXACT_TS, params, target)
                return
            except duckdb.Error:
                pass  # a ts the DOUBLE reading refuses: the path below names the event
        rel = _exact_ts(con, text, params["first_id"], params["base"], con.sql(_TYPED_SQL, params=params))
        con.execute(copy_sql(f"SELECT {_CAST_EVENTS} FROM rel", target))
        return
    _copy_events(con, _TYPED_SQL, params, target)


def _decoded_sql() -> str:
    """From the compiled decoder's run (`run`) to the stored columns. Its _deferred column holds, as a JSON
    object, the common args whose JSON type is not their column's (a stream given as "0x0", a float id):
    json_transform converts those, as on the general path."""
    spec, _ = _group_spec("common")
    replace = ", ".join(f'coalesce({a.column}, _d."{a.key}") AS {a.column}' for a in ARG_COLUMNS if a.group == "common")
    return (f"SELECT * EXCLUDE (_deferred, _d) REPLACE ({replace}) "
            f"FROM (SELECT *, json_transform(_deferred, {spec}) AS _d FROM run)")


_DECODED_SQL = _decoded_sql()


def _write_decoded(con, run, target: str) -> PartChecks:
    """The compiled decoder's run (an Arrow C stream of the stored columns) -> one Parquet part. Returns what
    the decoder gathered for the checks (its Run.checks holds the fields after rows, in PartChecks' order)."""
    select = _DECODED_SQL if run.deferred else "SELECT * EXCLUDE (_deferred) FROM run"
    con.execute(copy_sql(select, target))
    return PartChecks(run.rows, *run.checks)


def _copy_events(con, typed_sql: str, params: dict, target: str) -> None:
    # COPY through execute: a third of the per-chunk overhead of the relational API
    # (the paths are our own temp files, quoted)
    sql = typed_sql.replace("$path", literal(params['path']))
    con.execute(copy_sql(f"SELECT {_CAST_EVENTS} FROM ({sql})", target), {k: v for k, v in params.items() if k != "path"})


def _event_error(message: str, first_id: int) -> str:
    """DuckDB's message about a chunk -> which event of the trace, and what to do."""
    first_line = message.splitlines()[0] if message else "unreadable events"
    m = re.search(r"record/value (\d+): (.*)", first_line)
    if m:
        return (f"traceEvents[{first_id + int(m.group(1)) - 1}]: {m.group(2)}; each event must be a JSON object "
                "whose ts and dur are numbers: fix or drop that event")
    m = re.search(r"(?:Error|Exception): (.*)", first_line)
    return f"events could not be read ({(m.group(1) if m else first_line)}); each event must be a JSON object"


# rank_source of the run's only trace when it names no rank: taken as rank 0
ONLY_TRACE = "only trace"
ONLY_TRACE_NOTE = ("taken as rank 0: the run's only trace names no rank (no distributedInfo.rank, no rank<N> in "
                   "its name); before adding more traces, rename each to rank<N>.json or pass --rank-from")


def _resolve_rank(path: str, source: str, meta: dict, rank_from: str, forced_rank: int | None, only_trace: bool):
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    world_size = _world_size(path, info)
    if forced_rank is not None:
        return forced_rank, rank_from if rank_from in ("order",) else "option", world_size
    if rank_from == "auto" and info.get("rank") is not None:
        return _info_rank(path, info, world_size), "distributedInfo", world_size
    if rank_from in ("auto", "filename"):
        r = rank_from_filename(os.path.basename(source))
        if r is not None:
            return r, "filename", world_size
    elif rank_from.startswith("regex:"):
        m = re.search(rank_from[6:], source)
        if m and m.groups() and m.group(1).isdigit():
            return int(m.group(1)), "filename", world_size
        raise TraceFileError(path, f"--rank-from {rank_from!r} does not match this file's path with a numeric group")
    if only_trace and rank_from == "auto":
        return 0, ONLY_TRACE, world_size
    raise TraceFileError(
        path,
        "cannot tell which rank this trace belongs to: it has no distributedInfo.rank and its name has no "
        "'rank<N>'/'worker<N>'; rename it (e.g. rank3.json.gz) or pass --rank-from order "
        "(ranks by sorted file name) or --rank-from 'regex:<pattern with one (\\d+) group>'",
    )


def _world_size(path: str, info: dict) -> int | None:
    """distributedInfo.world_size: absent, or a positive integer."""
    given = info.get("world_size")
    if given is None:
        return None
    n = _int(given)
    if n is None or n < 1:
        raise TraceFileError(path, f"distributedInfo.world_size is {msgspec.json.encode(given).decode()}: a world "
                                   "size is a positive integer; fix the trace's distributedInfo")
    return n


def _info_rank(path: str, info: dict, world_size: int | None) -> int:
    """distributedInfo.rank: an integer in [0, world_size)."""
    given = info["rank"]
    r = _int(given)
    if r is None or r < 0 or (world_size is not None and r >= world_size):
        where = f"[0, {world_size})" if world_size is not None else "0 or more"
        raise TraceFileError(path, f"distributedInfo.rank is {msgspec.json.encode(given).decode()}: a rank is an "
                                   f"integer in {where}; fix the trace's distributedInfo, or pass --rank-from "
                                   "filename/order to take ranks from the file names")
    return r


def _derived_tables(con, stage_dir: str, ev: str, comm_parts: list[str]) -> dict[str, list[str]]:
    """The per-file tables derived from the events `ev` (a relation over the parts). comm_parts: the parts
    that may hold collective args (_run_checks); comm_args reads only those."""
    out = {}
    comm_ev = f"read_parquet({literal_list(comm_parts)})" if comm_parts else f"(SELECT * FROM {ev} LIMIT 0)"
    queries = {
        "steps": steps_query(ev),
        # a flow's start (s) and end (f) share (cat, id); one aggregation pairs them
        # (cheaper than a full outer join; a repeated id keeps its first start/end)
        "flows": f"""
            SELECT cat, flow_id, flow_id_label,
                   min(event_id) FILTER (WHERE ph = 's') AS start_event_id,
                   arg_min(ts_ns, event_id) FILTER (WHERE ph = 's') AS start_ts_ns,
                   arg_min(pid, event_id) FILTER (WHERE ph = 's') AS start_pid,
                   arg_min(tid, event_id) FILTER (WHERE ph = 's') AS start_tid,
                   min(event_id) FILTER (WHERE ph = 'f') AS end_event_id,
                   arg_min(ts_ns, event_id) FILTER (WHERE ph = 'f') AS end_ts_ns,
                   arg_min(pid, event_id) FILTER (WHERE ph = 'f') AS end_pid,
                   arg_min(tid, event_id) FILTER (WHERE ph = 'f') AS end_tid
            FROM {ev} WHERE ph IN ('s', 'f') AND (flow_id IS NOT NULL OR flow_id_label IS NOT NULL)
            GROUP BY cat, flow_id, flow_id_label
            ORDER BY coalesce(start_event_id, end_event_id)""",
        "memory": f"""
            SELECT event_id, ts_ns, pid, tid, {", ".join(c.replace(" AS mem_", " AS ") for c in _group_spec("memory")[1])}
            FROM (SELECT *, json_transform(args_json, {_group_spec("memory")[0]}) AS _memory
                  FROM {ev} WHERE ph = 'i' AND name = '[memory]')
            ORDER BY ts_ns, event_id""",
        # the sparse args: parsed only on the few events that carry them
        "gpu_args": f"""
            SELECT event_id, {", ".join(_group_spec("gpu")[1])}
            FROM (SELECT event_id, json_transform(args_json, {_group_spec("gpu")[0]}) AS _gpu
                  FROM {ev} WHERE cat IN {sql_in(DEVICE_OP_CATEGORIES)} AND args_json IS NOT NULL)
            ORDER BY event_id""",
        "comm_args": f"""
            SELECT event_id, {", ".join(_group_spec("comm")[1])}
            FROM (SELECT event_id, json_transform(args_json, {_group_spec("comm")[0]}) AS _comm
                  FROM {comm_ev} WHERE {_COMM_ARGS})
            ORDER BY event_id""",
    }
    def write(table: str) -> None:
        cur = con.cursor()  # queries run side by side: each writes its Parquet file on one thread
        try:
            cols = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t, _ in TABLES[table])
            target = os.path.join(stage_dir, f"{table}.parquet")
            written = cur.execute(copy_sql(f"SELECT {cols} FROM ({queries[table]})", target)).fetchone()
            if written is not None and written[0] == 0:
                # no file for an empty table: every query over the events view joins the sparse args tables,
                # and a store of 4,096 CPU ranks spent 0.4 s a query opening each one's 4,096 empty files
                os.unlink(target)
                return
            out[table] = [target]
        finally:
            cur.close()

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=DERIVED_AT_ONCE, thread_name_prefix="tracekit-derive") as pool:
        for f in [pool.submit(write, table) for table in queries]:
            f.result()
    return out


# events whose args carry collective metadata (record_param_comms, NCCL kernels)
_COMM_ARGS = "(contains(args_json, '\"Collective name\"') OR contains(args_json, '\"Process Group'))"


def _write_rank_row(con, stage_dir, span, source, meta, stream: TraceStream, rank_source, world_size) -> str:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    devices = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else None
    other = {k: v for k, v in meta.items() if k not in ("distributedInfo", "deviceProperties")}
    base = _int(meta.get("baseTimeNanoseconds"))
    hostname = next((str(meta[k]) for k in ("host_name", "hostname", "hostName") if meta.get(k)), None)
    enc = lambda v: None if v is None else msgspec.json.encode(v).decode()  # noqa: E731
    row = {
        "world_size": world_size,
        "backend": str(info.get("backend")) if info and info.get("backend") is not None else None,
        "rank_source": rank_source,
        "hostname": hostname,
        "device_names": enc([d.get("name") for d in devices if isinstance(d, dict)]) if devices else None,
        "source_file": source,
        "time_style": "relative" if base is not None else "absolute",
        "base_time_ns": base,
        "clock_offset_ns": 0,
        "event_count": span[0],
        "lost_event_count": stream.lost_events,
        "first_ts_ns": span[1],
        "last_end_ns": span[2],
        "distributed_info_json": enc(info),
        "device_properties_json": enc(devices),
        "trace_metadata_json": enc(other),
        "warnings_json": enc(stream.warnings),
    }
    cols = TABLES["ranks"]
    select = ", ".join(f"CAST(${c} AS {t}) AS {c}" for c, t, _ in cols)
    target = os.path.join(stage_dir, "ranks.parquet")
    con.execute(copy_sql(f"SELECT {select}", target), row)
    return target
