"""Flight-recorder dumps (PyTorch's per-rank ring buffer of collectives) -> the fr_entries table.

Reads the JSON dump (`_dump_fr_trace_json`, what tracekit.capture writes as rank<R>.fr.json) and the pickle
dump, the latter only through a restricted unpickler that builds plain containers, strings and numbers and
refuses everything else: a pickle can run code when loaded, and dumps come from other machines.
"""
from __future__ import annotations

import gzip
import zlib
import io
import json
import os
import pickle
import re

from ..errors import NotATraceError, TraceFileError
from ..store.schema import FR_COLUMNS

FR_SUFFIXES = (".pkl", ".pickle")



class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes, numbers, booleans and None; refuses every global, so a
    pickle cannot name a function (os.system, builtins.eval ...) to call while loading."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: flight-recorder dumps hold only "
                                     "plain containers, strings and numbers")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id: not a plain flight-recorder dump")


def load_pickle(path: str) -> object:
    """A pickle dump through the restricted unpickler; TraceFileError when it holds anything else."""
    try:
        with open(path, "rb") as f:
            return _PlainUnpickler(io.BytesIO(f.read())).load()
    except pickle.UnpicklingError as e:
        raise TraceFileError(path, f"unsafe or invalid pickle, not loaded: {e}") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError) as e:
        raise TraceFileError(path, f"not a readable pickle ({type(e).__name__}: {e})") from None


def load_dump(path: str) -> dict:
    """The dump as a dict (JSON, gzipped JSON or pickle); NotATraceError when it is not a flight-recorder dump."""
    with open(path, "rb") as f:
        head = f.read(2)
    if path.endswith(FR_SUFFIXES) or head[:1] == b"\x80":
        doc = load_pickle(path)
    else:
        try:
            opener = gzip.open if head == b"\x1f\x8b" else open
            with opener(path, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, EOFError, ValueError, RecursionError, zlib.error) as e:
            # (a truncated gzip raises EOFError, a corrupt one zlib.error or OSError)
            raise TraceFileError(path, f"not valid JSON ({type(e).__name__}: {e})") from None
    if not is_dump(doc):
        raise NotATraceError(path, "not a flight-recorder dump (no entries list)")
    return doc


def is_dump(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("entries"), list) and (
        "pg_config" in doc or "version" in doc or "pg_status" in doc)


def is_fr_candidate(path: str) -> bool:
    """A pickle, or JSON whose top level has an entries list beside pg_config / version (cheap: dumps are small,
    and only files that are not Kineto traces get here)."""
    if path.endswith(FR_SUFFIXES):
        return True
    try:
        if os.path.getsize(path) > (256 << 20):
            return False
        doc = load_dump(path)
    except (TraceFileError, OSError):
        return False
    return is_dump(doc)


def rank_from_name(source: str) -> int | None:
    """PyTorch names dumps <prefix><rank> (nccl_trace_rank_3); tracekit names them rank3.fr.json."""
    digits = re.findall(r"(\d+)", os.path.basename(source).split(".")[0])
    return int(digits[-1]) if digits else None


def _int(v):
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def _json(v):
    return None if v is None else json.dumps(v, separators=(",", ":"), default=str)


def _group_ranks(doc: dict) -> dict[str, str]:
    """pg name -> JSON ranks. pg_config is {name: {name, desc, ranks}} (ranks as a list or its text)."""
    out = {}
    cfg = doc.get("pg_config") or {}
    items = cfg.items() if isinstance(cfg, dict) else enumerate(cfg if isinstance(cfg, list) else [])
    for key, v in items:
        if not isinstance(v, dict):
            continue
        ranks = v.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                ranks = None
        if isinstance(ranks, list):
            for name in {str(key), str(v.get("name", key)), str(v.get("pg_name", key))}:
                out[name] = _json(ranks)
    return out


def entry_rows(doc: dict, source: str) -> list[dict]:
    groups = _group_ranks(doc)
    only = next(iter(set(groups.values()))) if len(set(groups.values())) == 1 else None
    status = doc.get("pg_status") or {}
    rows = []
    for e in doc["entries"]:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group") or [None, None]
        pg_name = str(pg[0]) if len(pg) > 0 and pg[0] is not None else None
        st = status.get(str(e.get("pg_id"))) or status.get(pg_name or "") or {}
        rows.append({
            "record_id": _int(e.get("record_id")), "pg_id": _int(e.get("pg_id")), "pg_name": pg_name,
            "pg_desc": str(pg[1]) if len(pg) > 1 and pg[1] is not None else None,
            # a gloo dump keys its one group by '' while entries name it "0": a single group is that group
            "pg_ranks": groups.get(pg_name or "", only),
            "collective_seq_id": _int(e.get("collective_seq_id")), "p2p_seq_id": _int(e.get("p2p_seq_id")),
            "is_p2p": bool(e.get("is_p2p", False)), "op_id": _int(e.get("op_id")),
            "profiling_name": e.get("profiling_name"),
            "input_sizes": _json(e.get("input_sizes")), "input_dtypes": _json(e.get("input_dtypes")),
            "output_sizes": _json(e.get("output_sizes")), "output_dtypes": _json(e.get("output_dtypes")),
            "time_created_ns": _int(e.get("time_created_ns")),
            "time_discovered_started_ns": _int(e.get("time_discovered_started_ns")),
            "time_discovered_completed_ns": _int(e.get("time_discovered_completed_ns")),
            "duration_ms": float(e["duration_ms"]) if isinstance(e.get("duration_ms"), (int, float)) else None,
            "timeout_ms": _int(e.get("timeout_ms")), "state": e.get("state"),
            "retired": bool(e["retired"]) if "retired" in e else None,
            "thread_id": None if e.get("thread_id") is None else str(e.get("thread_id")),
            "thread_name": e.get("thread_name"), "frames_json": _json(e.get("frames")),
            "pg_last_enqueued_seq": _int(st.get("last_enqueued_collective")),
            "pg_last_started_seq": _int(st.get("last_started_collective")),
            "pg_last_completed_seq": _int(st.get("last_completed_collective")),
            "dump_version": None if doc.get("version") is None else str(doc.get("version")),
            "source_file": source,
        })
    return rows


def write_entries(rows: list[dict], target: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"BIGINT": pa.int64(), "VARCHAR": pa.string(), "BOOLEAN": pa.bool_(), "DOUBLE": pa.float64()}
    schema = pa.schema([(c, types[t]) for c, t, _ in FR_COLUMNS])
    table = pa.Table.from_pylist(rows, schema=schema)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    pq.write_table(table, target)


def ingest_flight_recorder(path: str, source: str, stage_dir: str, forced_rank: int | None = None):
    """One dump -> a staged fr_entries Parquet file; a FileResult like a trace's (rank from the file name)."""
    from .kineto import FileResult

    doc = load_dump(path)
    rank = forced_rank if forced_rank is not None else rank_from_name(source)
    if rank is None:
        raise TraceFileError(path, "flight-recorder dump without a rank in its file name (name it rank<R>.fr.json)")
    rows = entry_rows(doc, source)
    target = os.path.join(stage_dir, "fr_entries.parquet")
    write_entries(rows, target)
    return FileResult(source=source, rank=rank, rank_source="filename", staged={"fr_entries": [target]},
                      event_count=len(rows), lost_event_count=0, world_size=None)
