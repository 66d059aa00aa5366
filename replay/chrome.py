"""A store (measured or replayed) as Chrome trace JSON: one merged file for Perfetto UI /
chrome://tracing, or one Kineto-style file per rank that `tracekit ingest` reads back.

Both are written by DuckDB (each event's JSON text built in SQL, args embedded as the
stored compact JSON) and moved into place atomically; no per-event Python.

Timestamps: Trace Event Format wants microseconds. Every ts / dur is written as an
exact decimal with three fractional digits (nanoseconds), relative to a base kept as
`baseTimeNanoseconds` (Kineto's convention), so the numbers stay small and a reader
that adds the base back gets the stored int64 nanoseconds exactly.
"""
from __future__ import annotations

import json
import os
import uuid

from tracekit.errors import StoreError, TracekitError
from tracekit.store import Store

__all__ = ["write_chrome_trace", "write_rank_traces"]

# Kineto's process/thread naming metadata; the merged trace writes its own instead (one
# process per rank and original process, so they say which rank they belong to)
_RENAMED_META = ("process_name", "process_sort_index", "thread_name")
# metadata about a whole process (process_labels, ...): written with tid 0, no thread of its own
_PROCESS_META = "(ph = 'M' AND starts_with(coalesce(name, ''), 'process_'))"


def write_chrome_trace(store_dir: str, path: str, *, ranks=None) -> str:
    """Write every rank of the store (or only `ranks`) as one Chrome trace JSON; return its path.

    path ends in .json or .json.gz (gzip). In the file:
    - each (rank, original process) is its own process: pid is a small positive integer
      (Perfetto reads pids and tids as 32-bit), named "rank R: <labels> <name> (pid P)" by a
      process_name metadata event, ordered by rank then the original sort index by
      process_sort_index;
    - each (rank, process, original thread) is its own thread: tid is a small positive
      integer (the same stream or thread id in two ranks would otherwise be merged into one
      track), named by thread_name with the original thread name and "(tid T)";
    - ts / dur are microseconds with three decimals (exact ns) relative to the earliest
      event; the absolute base is top-level `baseTimeNanoseconds` (and in otherData);
    - ph, cat, name, args (the stored args object), bp, s are the stored ones; flow
      events (s/f) keep their binding and get ids unique per (rank, cat, original id), so a
      launch on one rank never binds to a kernel on another;
    - displayTimeUnit is "ns"; otherData names the store, its ranks and its label.
    Events without a phase, and events other than metadata without a timestamp, are left out.
    """
    store = Store(store_dir)
    path = os.fspath(path)
    con = store.connect()
    try:
        sel = _ranks_filter(store, ranks)
        base = con.execute(f"SELECT min(ts_ns) FROM _events WHERE {sel}").fetchall()[0][0]
        if base is None:
            raise TracekitError(f"{store.path}: no timed events in the selected ranks; nothing to write")
        base = int(base)
        body = con.execute(_merged_sql(sel, base)).fetchall()[0][0] or ""
        ranks_present = [r for (r,) in
                         con.execute(f"SELECT DISTINCT rank FROM _events WHERE {sel} ORDER BY rank").fetchall()]
    finally:
        con.close()
    head = {"displayTimeUnit": "ns", "baseTimeNanoseconds": base,
            "otherData": {"generator": "tracekit replay.chrome", "store": store.path, "ranks": ranks_present,
                          "baseTimeNanoseconds": base, "label": store.manifest.label,
                          "kind": (store.manifest.label or {}).get("kind", "measured"),
                          "note": "pid/tid are renumbered per (rank, process, thread); names carry the originals"}}
    _write_json(path, head, body)
    return path


def write_rank_traces(store_dir: str, out_dir: str, *, ranks=None) -> list[str]:
    """Write one Kineto-style trace per rank, `<out_dir>/rank<R>.trace.json.gz`; return the paths.

    Each file holds the rank's stored events in their stored order (so event ids come back
    the same), with their original pids, tids, flow ids, categories, names and args; the
    trace's other top-level keys as ingested (deviceProperties, traceName, ...);
    distributedInfo with the store's rank, world size and backend; and baseTimeNanoseconds
    (the rank's original base for new-style traces, its earliest event for old-style ones)
    with ts / dur in microseconds relative to it, exact to the nanosecond. `tracekit ingest`
    of out_dir gives back the same events and times. A replayed store's label is kept under
    the top-level key "tracekitLabel". Existing files of the same names are replaced.
    """
    store = Store(store_dir)
    out_dir = os.fspath(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{out_dir}: cannot create the directory ({e.strerror})") from None
    con = store.connect()
    written = []
    try:
        sel = _ranks_filter(store, ranks, "r.rank")
        rows = con.execute(f"""
            SELECT r.rank, r.world_size, r.backend, r.base_time_ns, r.distributed_info_json, r.device_properties_json,
                   r.trace_metadata_json, (SELECT min(ts_ns) FROM _events e WHERE e.rank = r.rank) AS first_ts
            FROM _ranks r WHERE {sel} ORDER BY r.rank""").fetchall()
        for rank, world_size, backend, base_ns, info_json, devices_json, meta_json, first_ts in rows:
            doc = _loads_obj(meta_json)
            base = int(base_ns) if base_ns is not None else int(first_ts or 0)
            doc["baseTimeNanoseconds"] = base
            if devices_json is not None:
                doc["deviceProperties"] = json.loads(devices_json)
            info = _loads_obj(info_json)
            info["rank"] = int(rank)
            if world_size is not None:
                info["world_size"] = int(world_size)
            if backend is not None:
                info["backend"] = backend
            doc["distributedInfo"] = info
            if store.manifest.label is not None:
                doc["tracekitLabel"] = store.manifest.label
            doc.pop("traceEvents", None)
            body = con.execute(_rank_sql(int(rank), base)).fetchall()[0][0] or ""
            target = os.path.join(out_dir, f"rank{int(rank)}.trace.json.gz")
            _write_json(target, doc, body)
            written.append(target)
    finally:
        con.close()
    return written


# ---------------------------------------------------------------------------------------------- SQL

def _ranks_filter(store: Store, ranks, column: str = "rank") -> str:
    if ranks is None:
        return "true"
    try:
        wanted = sorted({int(r) for r in ranks})
    except (TypeError, ValueError):
        raise TracekitError(f"ranks must be integers, not {ranks!r}") from None
    missing = [r for r in wanted if r not in store.ranks]
    if missing:
        raise TracekitError(f"{store.path}: no rank {', '.join(map(str, missing))} in the store "
                            f"(ranks: {', '.join(map(str, store.ranks)) or 'none'})")
    return f"{column} IN (" + ", ".join(map(str, wanted)) + ")" if wanted else "false"


def _us(x: str) -> str:
    """SQL: int64 ns -> exact decimal microseconds text ('12.345', '-0.007'); NULL stays NULL."""
    return (f"(CASE WHEN {x} < 0 THEN '-' ELSE '' END || (abs({x}) // 1000)::VARCHAR || '.' || "
            f"lpad((abs({x}) % 1000)::VARCHAR, 3, '0'))")


def _field(key: str, value_sql: str) -> str:
    return f"""'"{key}":' || {value_sql}"""


def _obj(*fields: str) -> str:
    # concat_ws skips NULLs: a field whose value is NULL is left out
    return "'{' || concat_ws(',', " + ", ".join(fields) + ") || '}'"


def _rank_sql(rank: int, base: int) -> str:
    line = _obj(
        _field("ph", "to_json(ph)"), _field("cat", "to_json(cat)"), _field("name", "to_json(name)"),
        _field("pid", "coalesce(pid::VARCHAR, to_json(pid_label))"),
        _field("tid", "coalesce(tid::VARCHAR, to_json(tid_label))"),
        _field("ts", _us(f"(ts_ns - {base})")), _field("dur", _us("dur_ns")),
        _field("id", "coalesce(flow_id::VARCHAR, to_json(flow_id_label))"),
        _field("bp", "to_json(bp)"), _field("s", "to_json(scope)"), _field("args", "args_json"))
    return f"SELECT string_agg({line}, ',\n' ORDER BY event_id) FROM _events WHERE rank = {rank}"


def _merged_sql(sel: str, base: int) -> str:
    # labels never look like integers (ingest reads an integer-looking id as the integer)
    pkey = "coalesce(pid::VARCHAR, pid_label, '')"
    tkey = "coalesce(tid::VARCHAR, tid_label, '')"
    fkey = "coalesce(flow_id::VARCHAR, flow_id_label)"
    event = _obj(
        _field("ph", "to_json(e.ph)"), _field("cat", "to_json(e.cat)"),
        _field("name", "to_json(coalesce(e.name, ''))"),
        _field("pid", "p.npid::VARCHAR"), _field("tid", "coalesce(t.ntid, 0)::VARCHAR"),
        _field("ts", _us(f"(e.ts_ns - {base})")), _field("dur", _us("e.dur_ns")),
        _field("id", "f.nid::VARCHAR"), _field("bp", "to_json(e.bp)"), _field("s", "to_json(e.scope)"),
        _field("args", "e.args_json"))
    pmeta = lambda name, args: _obj(  # noqa: E731
        _field("ph", """'"M"'"""), _field("name", f"""'"{name}"'"""), _field("pid", "npid::VARCHAR"),
        _field("tid", "0"), _field("args", args))
    tmeta = _obj(_field("ph", """'"M"'"""), _field("name", """'"thread_name"'"""), _field("pid", "npid::VARCHAR"),
                 _field("tid", "ntid::VARCHAR"), _field("args", _obj(_field("name", "to_json(tname)"))))
    # "rank 0: CPU python3.11 (pid 18605)", "rank 0: GPU 0 python3.8 (pid 0)", "rank 0: Spans"
    pname = ("'rank ' || rank::VARCHAR || ': ' || concat_ws(' ', labels, pname, "
             "CASE WHEN pnum IS NOT NULL THEN '(pid ' || pnum::VARCHAR || ')' WHEN pkey <> '' THEN pkey "
             "ELSE '(no pid)' END)")
    return f"""
    WITH e AS (
      SELECT *, {pkey} AS pkey, {tkey} AS tkey FROM _events WHERE {sel} AND ph IS NOT NULL),
    meta AS (  -- the original names of processes and threads, from Kineto's metadata events
      SELECT rank, pkey, tkey, name, json_extract_string(args_json, '$.name') AS n,
             json_extract_string(args_json, '$.labels') AS labels,
             TRY_CAST(json_extract(args_json, '$.sort_index') AS BIGINT) AS sort_index
      FROM e WHERE ph = 'M'),
    procs AS (
      SELECT k.rank, k.pkey,
             row_number() OVER (ORDER BY k.rank, min(ms.sort_index), k.pkey) AS npid,
             any_value(mn.n) AS pname, any_value(ml.labels) AS labels, any_value(k.pid) AS pnum
      FROM (SELECT DISTINCT rank, pkey, pid FROM e) k
      LEFT JOIN meta ms ON ms.rank = k.rank AND ms.pkey = k.pkey AND ms.name = 'process_sort_index'
      LEFT JOIN meta mn ON mn.rank = k.rank AND mn.pkey = k.pkey AND mn.name = 'process_name'
      LEFT JOIN meta ml ON ml.rank = k.rank AND ml.pkey = k.pkey AND ml.name = 'process_labels'
      GROUP BY k.rank, k.pkey),
    threads AS (
      SELECT k.rank, k.pkey, k.tkey, row_number() OVER (ORDER BY k.rank, k.pkey, k.tkey) AS ntid,
             -- the original name, with the original tid when the name does not already say it
             CASE WHEN any_value(mt.n) IS NULL THEN (CASE WHEN k.tkey <> '' THEN 'thread ' || k.tkey ELSE 'thread' END)
                  WHEN k.tkey = '' OR contains(any_value(mt.n), k.tkey) THEN any_value(mt.n)
                  ELSE any_value(mt.n) || ' (tid ' || k.tkey || ')' END AS tname
      FROM (SELECT DISTINCT rank, pkey, tkey FROM e WHERE NOT {_PROCESS_META}) k
      LEFT JOIN meta mt ON mt.rank = k.rank AND mt.pkey = k.pkey AND mt.tkey = k.tkey AND mt.name = 'thread_name'
      GROUP BY k.rank, k.pkey, k.tkey),
    flows AS (
      SELECT rank, cat, fk, row_number() OVER (ORDER BY rank, cat, fk) AS nid
      FROM (SELECT DISTINCT rank, cat, {fkey} AS fk FROM e WHERE ph IN ('s', 't', 'f') AND {fkey} IS NOT NULL)),
    lines AS (
      SELECT 0 AS part, npid AS k1, 0 AS k2, {pmeta("process_name", _obj(_field("name", f"to_json({pname})")))} AS line
      FROM procs
      UNION ALL
      SELECT 0, npid, 1, {pmeta("process_sort_index", _obj(_field("sort_index", "npid::VARCHAR")))} FROM procs
      UNION ALL
      SELECT 1, p.npid, t.ntid, {tmeta} FROM threads t JOIN procs p USING (rank, pkey)
      UNION ALL
      SELECT 2, e.rank, e.event_id, {event}
      FROM e JOIN procs p USING (rank, pkey) LEFT JOIN threads t USING (rank, pkey, tkey)
      LEFT JOIN flows f ON f.rank = e.rank AND f.cat IS NOT DISTINCT FROM e.cat
           AND f.fk = {fkey.replace('flow_id', 'e.flow_id')}
           AND e.ph IN ('s', 't', 'f')
      WHERE (e.ts_ns IS NOT NULL OR e.ph = 'M') AND NOT (e.ph = 'M' AND e.name IN {_RENAMED_META}))
    SELECT string_agg(line, ',\n' ORDER BY part, k1, k2) FROM lines"""


# ---------------------------------------------------------------------------------------------- files

def _loads_obj(text) -> dict:
    if text is None:
        return {}
    try:
        v = json.loads(text)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _write_json(path: str, head: dict, body: str) -> None:
    """{head..., "traceEvents": [body]} to path (gzip for .gz), via a temporary file and a rename."""
    text = json.dumps(head, separators=(",", ":"), allow_nan=False)
    assert text.endswith("}")
    data = (text[:-1] + ("," if len(head) else "") + '"traceEvents":[\n' + body + "\n]}\n").encode()
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            if path.endswith(".gz"):
                f.write(_gzip(data))
            else:
                f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"{path}: cannot write the trace ({e.strerror or e})") from None


def _gzip(data: bytes) -> bytes:
    try:  # ISA-L (an optional dependency the ingest also uses): several times faster than zlib
        from isal import igzip

        return igzip.compress(data, compresslevel=1)
    except ImportError:  # pragma: no cover
        import gzip

        return gzip.compress(data, compresslevel=3)
