"""Rebuild trace events from a store, to compare with the source JSON."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path


def load_source_events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal)
    return doc if isinstance(doc, list) else doc["traceEvents"]


def _num(v):
    if isinstance(v, Decimal):
        return v
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return Decimal(str(v))
    return v


def normalise_source(e: dict, base_ns: int = 0) -> dict:
    out = {}
    for k in ("ph", "cat", "name", "bp", "s"):
        if k in e:
            out[k] = e[k]
    for k in ("pid", "tid", "id"):
        if k in e:
            v = e[k]
            out[k] = int(v) if isinstance(v, (int, Decimal)) and Decimal(v) == int(v) else str(v)
    if "ts" in e:
        out["ts_ns"] = int(_num(e["ts"]) * 1000) + base_ns
    if "dur" in e:
        out["dur_ns"] = int((_num(e["dur"]) * 1000).to_integral_value())
    if "args" in e:
        out["args"] = json.loads(json.dumps(e["args"], default=float))
    return out


def store_events(run, rank: int) -> list[dict]:
    df = run.sql("SELECT * FROM events WHERE rank = ? ORDER BY event_id", [rank])
    out = []
    for r in df.to_dict(orient="records"):
        e = {}
        for k in ("ph", "cat", "name", "bp"):
            if r[k] is not None and r[k] == r[k]:
                e[k] = r[k]
        if r["scope"] is not None and r["scope"] == r["scope"]:
            e["s"] = r["scope"]
        for k, label in (("pid", "pid_label"), ("tid", "tid_label"), ("id", None)):
            col = "flow_id" if k == "id" else k
            lab = "flow_id_label" if k == "id" else label
            if _present(r[col]):
                e[k] = int(r[col])
            elif _present(r[lab]):
                e[k] = r[lab]
        if _present(r["ts_ns"]):
            e["ts_ns"] = int(r["ts_ns"])
        if _present(r["dur_ns"]):
            e["dur_ns"] = int(r["dur_ns"])
        if _present(r["args_json"]):
            e["args"] = json.loads(r["args_json"])
        out.append(e)
    return out


def _present(v) -> bool:
    return v is not None and v == v  # NaN/NA-safe
