"""run.json (the run manifest capture writes beside the traces) -> the run_manifest table.

The one place that reads run.json after capture: its hosts, parallel layout and measured step times
travel with the store from here on (Store.run_manifest), so a store moved away from its trace
directory still knows them.
"""
from __future__ import annotations

import json
import os

from ..capture.manifest import MANIFEST_NAME, read
from ..store.schema import NO_RANK, RUN_MANIFEST_COLUMNS


def is_run_manifest(source: str) -> bool:
    """Only the trace directory's own run.json is the run's manifest (one in a subfolder is another run's)."""
    return source == MANIFEST_NAME


def ingest_run_manifest(path: str, source: str, stage_dir: str):
    """run.json -> a staged one-row run_manifest Parquet file (rank NO_RANK); TraceFileError when unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .kineto import FileResult

    doc = read(path)
    version = doc.get("tracekit_run_manifest")
    row = {"manifest_version": version if isinstance(version, int) and not isinstance(version, bool) else None,
           "doc_json": json.dumps(doc, separators=(",", ":")), "source_file": source}
    types = {"BIGINT": pa.int64(), "VARCHAR": pa.string()}
    schema = pa.schema([(c, types[t]) for c, t, _ in RUN_MANIFEST_COLUMNS])
    target = os.path.join(stage_dir, "run_manifest.parquet")
    os.makedirs(stage_dir, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row], schema=schema), target)
    return FileResult(source=source, rank=NO_RANK, rank_source="none", staged={"run_manifest": [target]},
                      event_count=1, lost_event_count=0, world_size=None)
