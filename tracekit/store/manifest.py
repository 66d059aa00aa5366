"""The store's manifest: which source files made which Parquet files.

The manifest is the store's single commit point. Writers build new Parquet
files under fresh names, then replace manifest.json atomically (commit.py owns
that switch); readers list files from the manifest only. A crash at any moment
leaves either the old or the new manifest, and both name complete files.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from .. import __version__
from ..errors import StoreError
from .schema import SCHEMA_VERSION

MANIFEST = "manifest.json"
FORMAT = "tracekit-store"


@dataclass
class SourceEntry:
    size: int
    mtime_ns: int
    sha256: str
    rank: int
    rank_source: str
    event_count: int
    lost_event_count: int
    warnings: list[str]
    files: dict[str, list[str]]  # table -> paths relative to the store
    world_size: int | None = None
    ingested_ns: int = 0
    kind: str = "trace"  # trace | flight_recorder | nccl_inspector | nccl_tests (rank -1)


@dataclass
class Manifest:
    trace_dir: str
    sources: dict[str, SourceEntry] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # file -> why it is not a trace
    schema_version: int = SCHEMA_VERSION
    tool_version: str = __version__
    updated_ns: int = 0
    # What kind of run this store holds beyond a measured one: None for a measured
    # (ingested) run; a predicted run written by replay carries a JSON object such as
    # {"kind": "replay", "source_store": ..., "scenario": ..., "tool_version": ...}.
    # Optional and added without a schema bump: manifests without it read as None.
    label: dict | None = None

    def files(self, table: str) -> list[str]:
        return [p for name in sorted(self.sources) for p in self.sources[name].files.get(table, [])]

    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        if d["label"] is None:  # a measured run's manifest stays as it was before labels existed
            del d["label"]
        return d


# Manifest.skipped entries: "<size>|<mtime_ns>|<why>", so an unchanged non-trace is not sniffed again.
def skip_entry(st, reason: str) -> str:
    return f"{st.st_size}|{st.st_mtime_ns}|{reason}"


def skip_reason(entry: str) -> str:
    return entry.split("|", 2)[-1]


def skip_matches(entry: str, st) -> bool:
    size, mtime, _ = (entry.split("|", 2) + ["", "", ""])[:3]
    return size == str(st.st_size) and mtime == str(st.st_mtime_ns)


def load(store_dir: str) -> Manifest | None:
    path = os.path.join(store_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable manifest ({e}); delete {store_dir} and ingest again") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise StoreError(f"{path}: not a tracekit store manifest; delete {store_dir} and ingest again")
    try:
        sources = {k: SourceEntry(**v) for k, v in d.get("sources", {}).items()}
        return Manifest(trace_dir=d["trace_dir"], sources=sources, skipped=d.get("skipped", {}),
                        schema_version=d.get("schema_version", 0), tool_version=d.get("tool_version", "?"),
                        updated_ns=d.get("updated_ns", 0), label=_label(d.get("label")))
    except (TypeError, KeyError) as e:
        raise StoreError(f"{path}: damaged manifest ({e}); delete {store_dir} and ingest again") from None


def _label(v) -> dict | None:
    if v is None or isinstance(v, dict):
        return v
    raise TypeError(f"label is a {type(v).__name__}, not an object")
