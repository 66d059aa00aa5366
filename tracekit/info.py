"""What a store holds: ranks, world size, devices, steps, time span, counts, warnings."""
from __future__ import annotations

import json

from .ingest.kineto import ONLY_TRACE, ONLY_TRACE_NOTE
from .store.manifest import skip_reason


def run_info(run) -> dict:
    m = run.store.manifest
    # The time span comes from timed events (ph X with ts and dur) only: metadata, instant and counter
    # events may carry any timestamp (an MTIA trace's metadata sit 41 days before its 13 s of events).
    per_rank = run.sql("""
        SELECT r.rank, r.source_file, r.rank_source, r.world_size, r.backend, r.hostname, r.device_names,
               r.time_style, x.first_ts_ns, x.last_end_ns, x.last_end_ns - x.first_ts_ns AS span_ns,
               r.event_count, r.lost_event_count,
               coalesce(s.steps, 0) AS steps, coalesce(x.kernels, 0) AS kernels, coalesce(x.gpu_ops, 0) AS gpu_ops,
               coalesce(x.cpu_ops, 0) AS cpu_ops
        FROM ranks r
        LEFT JOIN (SELECT rank, count(*) AS steps FROM steps GROUP BY rank) s USING (rank)
        LEFT JOIN (SELECT rank, min(ts_ns) AS first_ts_ns, max(ts_ns + dur_ns) AS last_end_ns,
                          count(*) FILTER (WHERE device_op_kind(cat) = 'kernel') AS kernels,
                          count(*) FILTER (WHERE device_op_kind(cat) IS NOT NULL) AS gpu_ops,
                          count(*) FILTER (WHERE cat = 'cpu_op') AS cpu_ops
                   FROM events WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns IS NOT NULL GROUP BY rank) x USING (rank)
        ORDER BY rank""")
    categories = run.sql("""
        SELECT coalesce(cat, '') AS category, ph, count(*) AS events FROM events GROUP BY ALL ORDER BY events DESC""")
    sizes = [int(w) for w in per_rank["world_size"].dropna().unique()]
    world_size = max(sizes) if sizes else None
    ranks = [int(r) for r in per_rank["rank"]]
    devices = sorted({d for v in per_rank["device_names"].dropna() for d in json.loads(v) if d})
    warnings = {src: e.warnings for src, e in sorted(m.sources.items()) if e.warnings}
    traces = {src: e for src, e in sorted(m.sources.items()) if e.kind == "trace"}
    notes = []
    if len(sizes) > 1:
        notes.append(f"ranks disagree on the world size: {sorted(sizes)}")
    if world_size and len(ranks) < world_size:
        notes.append(f"{len(ranks)} of {world_size} ranks present (a sampled or partial trace set)")
    for src, e in traces.items():
        if e.rank_source == ONLY_TRACE:
            notes.append(f"{src}: {ONLY_TRACE_NOTE}")
        elif e.rank_source != "distributedInfo":
            notes.append(f"{src}: rank {e.rank} taken from the {'file name' if e.rank_source == 'filename' else e.rank_source}")
    notes += _unknown_device_ops(run)
    return {
        "trace_dir": m.trace_dir,
        "store": run.store.path,
        "ranks": ranks,
        "world_size": world_size,
        "devices": devices,
        "steps": _int(per_rank["steps"].max()) or 0,
        "first_ts_ns": _int(per_rank["first_ts_ns"].min()),
        "last_end_ns": _int(per_rank["last_end_ns"].max()),
        "event_count": _int(per_rank["event_count"].sum()) or 0,
        "per_rank": per_rank,
        "categories": categories,
        "skipped": {k: skip_reason(v) for k, v in m.skipped.items()},
        "flight_recorder_dumps": sorted(src for src, e in m.sources.items() if e.kind not in ("trace", "run_manifest")),
        "warnings": warnings,
        "notes": notes,
    }


def _unknown_device_ops(run) -> list[str]:
    """A launch flow (ac2g) runs from the host's call to the device op it launched, on another lane: where
    no op of a known device category sits at such a flow's end, the events there are device ops of a
    category store/devices.py does not know. (Unpaired flow ends, which some traces have on runtime
    calls, and the device lanes' sync markers say nothing.)"""
    unknown = run.sql("""
        WITH ends AS (SELECT DISTINCT rank, end_pid AS pid, end_tid AS tid, end_ts_ns AS ts_ns
                      FROM flows WHERE cat = 'ac2g' AND end_ts_ns IS NOT NULL AND start_pid IS NOT NULL
                        AND end_pid IS DISTINCT FROM start_pid),
        at_end AS (SELECT e.rank, e.pid, e.tid, e.ts_ns, e.cat FROM events e JOIN ends USING (rank, pid, tid, ts_ns)
                   WHERE e.ph = 'X'),
        unmatched AS (SELECT rank, pid, tid, ts_ns FROM at_end GROUP BY ALL HAVING count(device_op_kind(cat)) = 0)
        SELECT a.cat, count(*) AS n FROM at_end a JOIN unmatched USING (rank, pid, tid, ts_ns)
        WHERE a.cat IS NOT NULL AND NOT is_device_lane_marker(a.cat) AND NOT is_device_runtime(a.cat)
        GROUP BY a.cat ORDER BY a.cat""")
    return [f"{n} events of category {cat!r} end launch flows (ac2g) as device ops do, but tracekit does not know "
            "the category: they are left out of gpu_ops and the analyses; add it to tracekit/store/devices.py"
            for cat, n in zip(unknown["cat"], unknown["n"])]


def _int(v) -> int | None:
    """An int, or None for NULL/NA (a trace whose events have no timestamps)."""
    import pandas as pd

    return None if v is None or pd.isna(v) else int(v)
