"""NCCL's own measurements -> store tables: nccl-tests output (the reference bandwidth curve, table
nccl_tests) and NCCL Inspector plugin logs (per-rank collective timings, table nccl_inspector).

Formats, as the tools write them:
- nccl-tests `-J out.json` (src/util.cu, JSON_FILE_VERSION 2): a top-level object with `args` (argv;
  args[0] names the test binary, e.g. all_reduce_perf) and `results`, a list of
  {size, count, type, redop, root (text, "%6i"), out_of_place {time|cpu_time, alg_bw, bus_bw, nwrong} or
  null, in_place {...}}; a NaN is written as the string "nan", nwrong is null without validation.
- nccl-tests text: the same table on stdout; a `#  size count type redop root time algbw busbw #wrong ...`
  header names the columns (out-of-place block, then in-place block; `-T` / per-iteration runs add
  columns), data rows do not start with '#'; `# Collective test starting: all_reduce_perf` names the test.
- NCCL Inspector (ext-profiler/inspector, `<dump dir>/<host>-pid<pid>.log`): one JSON object per line,
  {header {id (comm hash "0x..."), rank (in the communicator), n_ranks, nnodes}, metadata {...},
  coll_perf {coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us, coll_timing_source, coll_algobw_gbs,
  coll_busbw_gbs, event_trace_ts {...} when verbose}}. coll_msg_size_bytes is per rank: the plugin itself
  multiplies it by n_ranks for AllGather / ReduceScatter (inspectorComputeCollBw).
"""
from __future__ import annotations

import json
import math
import os
import re

from ..errors import NotATraceError, TraceFileError
from ..store.schema import NCCL_INSPECTOR_COLUMNS, NCCL_TESTS_COLUMNS, NO_RANK
INSPECTOR_SUFFIXES = (".log", ".jsonl")

# test binary / Inspector coll name -> the op names the collectives analysis uses
_OPS = (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
        ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
        ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"), ("send", "send"), ("recv", "recv"))


def canonical_op(name: str | None) -> str | None:
    if not name:
        return None
    flat = name.lower().replace("_", "")
    return next((op for key, op in _OPS if key in flat), None)


def _num(v):
    """A float, or None for null / "nan" / "N/A" (nccl-tests writes NaN as a string)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _row(op, size, count, dtype, redop, root, t_us, algbw, busbw, nwrong, in_place, source):
    nw = _num(nwrong)
    return {"op": op, "size_bytes": int(size), "count": int(count), "dtype": dtype, "redop": redop,
            "root": int(root), "time_us": _num(t_us), "algbw_gbps": _num(algbw), "busbw_gbps": _num(busbw),
            "in_place": in_place, "nwrong": None if nw is None else int(nw), "source_file": source}


def _op_from_names(*names) -> str | None:
    for n in names:
        op = canonical_op(os.path.basename(n)) if n else None
        if op:
            return op
    return None


def parse_nccl_tests(path: str) -> list[dict]:
    """Rows of an nccl-tests result file (JSON or text); TraceFileError naming the file when it holds none."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFileError(path, f"cannot read the file ({e.strerror})") from None
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise TraceFileError(path, f"not valid JSON ({e})") from None
        return _parse_json(doc, path)
    return _parse_text(text, path)


def _parse_json(doc, path: str) -> list[dict]:
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise TraceFileError(path, "JSON without a results list: not nccl-tests -J output")
    argv = doc.get("args") if isinstance(doc.get("args"), list) else []
    op = _op_from_names(argv[0] if argv else None, path)
    if op is None:
        raise TraceFileError(path, "cannot tell which collective was tested (args[0] names no *_perf binary)")
    rows = []
    for r in doc["results"]:
        if not isinstance(r, dict):
            continue
        try:
            head = (int(r["size"]), int(r["count"]), str(r["type"]), str(r["redop"]), int(str(r["root"]).strip()))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFileError(path, f"a results entry without size/count/type/redop/root ({e})") from None
        for key, in_place in (("out_of_place", False), ("in_place", True)):
            body = r.get(key)
            if isinstance(body, dict):
                rows.append(_row(op, *head, body.get("time", body.get("cpu_time")), body.get("alg_bw"),
                                 body.get("bus_bw"), body.get("nwrong"), in_place, None))
    if not rows:
        raise TraceFileError(path, "nccl-tests JSON with no result rows")
    return rows


_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


def _parse_text(text: str, path: str) -> list[dict]:
    op = None
    columns: list[str] | None = None
    rows = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _STARTING.match(s)
            if m:
                op = canonical_op(m.group(1))
            names = s.lstrip("#").split()
            if names[:2] == ["size", "count"]:
                columns = names
            continue
        if columns is None:
            continue
        tokens = s.split()
        try:
            lead = columns.index("time") if "time" in columns else columns.index("cputime")
        except ValueError:
            raise TraceFileError(path, "nccl-tests header without a time column") from None
        times = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
        width = times[1] - times[0] if len(times) > 1 else len(columns) - lead
        if len(tokens) < lead + 4 or not tokens[0].isdigit():
            continue  # a message line between results ("# ..." already skipped)
        head = dict(zip(columns[:lead], tokens[:lead]))
        root = head.get("root", "-1")
        body = tokens[lead:]
        # an in-place-only line (trace replay) leaves the out-of-place block blank
        blocks = [(body[:width], False), (body[width:2 * width], True)] if len(body) >= 2 * width else [(body, True)]
        for block, in_place in blocks:
            if len(block) < 4:
                continue
            rows.append((head, root, block, in_place))
    if op is None:
        op = _op_from_names(path)
    if columns is None or not rows:
        raise TraceFileError(path, "no nccl-tests result table (a '# size count type redop root time algbw busbw "
                                   "#wrong ...' header and rows); pass the -J JSON or the test's stdout")
    if op is None:
        raise TraceFileError(path, "cannot tell which collective was tested: no '# Collective test starting:' line; "
                                   "name the file after the test (all_reduce_perf.txt)")
    try:
        return [_row(op, h["size"], h["count"], h.get("type"), h.get("redop"), root, b[0], b[1], b[2],
                     b[3], in_place, None) for h, root, b, in_place in rows]
    except (KeyError, ValueError) as e:
        raise TraceFileError(path, f"a result row that is not size/count/... numbers ({e})") from None


# --- NCCL Inspector --------------------------------------------------------------------------------------

def _inspector_record(obj) -> bool:
    return (isinstance(obj, dict) and isinstance(obj.get("header"), dict) and isinstance(obj.get("coll_perf"), dict)
            and "id" in obj["header"] and "coll_sn" in obj["coll_perf"])


def is_inspector_candidate(path: str) -> bool:
    """The first non-empty line is one Inspector record (cheap: reads one line)."""
    try:
        with open(path, "rb") as f:
            for _ in range(16):
                line = f.readline(1 << 20)
                if not line:
                    return False
                if line.strip():
                    return _inspector_record(json.loads(line))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return False


def _min_ts(events, key):
    vals = [e.get(key) for e in events or [] if isinstance(e, dict) and isinstance(e.get(key), (int, float))]
    vals = [v for v in vals if v > 0]
    return int(min(vals)) if vals else None


def inspector_rows(path: str, source: str) -> list[dict]:
    rows = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                # the plugin appends while the job runs: a torn last line is expected, anything else is not
                if not f.read(1):
                    break
                raise TraceFileError(path, f"line {n}: not JSON ({e})") from None
            if not _inspector_record(obj):
                raise TraceFileError(path, f"line {n}: not an NCCL Inspector record (header + coll_perf)")
            h, c = obj["header"], obj["coll_perf"]
            ts = c.get("event_trace_ts") if isinstance(c.get("event_trace_ts"), dict) else {}
            kstart = _min_ts(ts.get("kernel_events"), "kernel_start_ts")
            rows.append({
                "comm_hash": str(h.get("id")), "comm_rank": _int(h.get("rank")), "n_ranks": _int(h.get("n_ranks")),
                "nnodes": _int(h.get("nnodes")), "coll": c.get("coll"), "op": canonical_op(c.get("coll")),
                "coll_sn": _int(c.get("coll_sn")), "msg_size_bytes": _int(c.get("coll_msg_size_bytes")),
                "exec_time_us": _num(c.get("coll_exec_time_us")), "timing_source": c.get("coll_timing_source"),
                "algbw_gbps": _num(c.get("coll_algobw_gbs")), "busbw_gbps": _num(c.get("coll_busbw_gbs")),
                "coll_start_us": _int(ts.get("coll_start_ts")) or None, "kernel_start_us": kstart,
                "hostname": (obj.get("metadata") or {}).get("hostname"), "pid": _int((obj.get("metadata") or {}).get("pid")),
                "dump_timestamp_us": _int((obj.get("metadata") or {}).get("dump_timestamp_us")),
                "source_file": source,
            })
    if not rows:
        raise NotATraceError(path, "no NCCL Inspector records")
    return rows


def _int(v):
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def _write(rows: list[dict], columns, target: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"BIGINT": pa.int64(), "VARCHAR": pa.string(), "BOOLEAN": pa.bool_(), "DOUBLE": pa.float64()}
    schema = pa.schema([(c, types[t]) for c, t, _ in columns])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), target)


def ingest_nccl_tests(path: str, source: str, stage_dir: str):
    """One nccl-tests result file -> a staged nccl_tests Parquet file (rank NO_RANK)."""
    from .kineto import FileResult

    rows = parse_nccl_tests(path)
    for r in rows:
        r["source_file"] = source
    target = os.path.join(stage_dir, "nccl_tests.parquet")
    _write(rows, NCCL_TESTS_COLUMNS, target)
    return FileResult(source=source, rank=NO_RANK, rank_source="none", staged={"nccl_tests": [target]},
                      event_count=len(rows), lost_event_count=0, world_size=None)


def ingest_inspector(path: str, source: str, stage_dir: str):
    """One Inspector log (one process) -> a staged nccl_inspector Parquet file. The process's global rank is
    its rank in the largest communicator it belongs to (the world communicator when it logged one)."""
    from .kineto import FileResult

    rows = inspector_rows(path, source)
    world = max(rows, key=lambda r: (r["n_ranks"] or 0, -(r["comm_rank"] or 0)))
    rank = world["comm_rank"]
    if rank is None:
        raise TraceFileError(path, "NCCL Inspector records without a header rank")
    target = os.path.join(stage_dir, "nccl_inspector.parquet")
    _write(rows, NCCL_INSPECTOR_COLUMNS, target)
    return FileResult(source=source, rank=rank, rank_source="inspector_header", staged={"nccl_inspector": [target]},
                      event_count=len(rows), lost_event_count=0, world_size=world["n_ranks"])
