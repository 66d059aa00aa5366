"""The steps table's definition, one for every writer of the store: ingest derives it from a trace's events,
the replay's writer from the re-timed events (tests/test_replay_chrome.py checks the two agree)."""
from __future__ import annotations

from .devices import DEVICE_LANE_MARKERS, DEVICE_OP_CATEGORIES, RUNTIME_CATEGORIES, sql_in


def steps_query(ev: str) -> str:
    """The steps table from the events relation `ev` (ingest's derived table, and the replay writer's on the
    re-timed events): a step is a host ProfilerStep#N complete event (not its GPU mirror); its GPU span runs
    from the first start to the last end of the GPU ops whose launching runtime call starts inside it."""
    return f"""
            WITH s AS (
              SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS BIGINT) AS step, name,
                     ts_ns, dur_ns, ts_ns + dur_ns AS end_ns, pid, tid
              FROM {ev} WHERE ph = 'X' AND name LIKE 'ProfilerStep#%' AND dur_ns IS NOT NULL
                AND coalesce(cat NOT IN {sql_in(DEVICE_LANE_MARKERS)}, true)),
            launch AS (
              SELECT ts_ns, correlation FROM {ev}
              WHERE cat IN {sql_in(RUNTIME_CATEGORIES)} AND correlation IS NOT NULL),
            gpu AS (
              SELECT correlation, min(ts_ns) AS g0, max(ts_ns + dur_ns) AS g1 FROM {ev}
              WHERE cat IN {sql_in(DEVICE_OP_CATEGORIES)} AND correlation IS NOT NULL GROUP BY correlation),
            sg AS (
              SELECT s.step, s.ts_ns, min(gpu.g0) AS gpu_start_ns, max(gpu.g1) AS gpu_end_ns
              FROM s JOIN launch l ON l.ts_ns >= s.ts_ns AND l.ts_ns < s.end_ns
                     JOIN gpu ON gpu.correlation = l.correlation
              GROUP BY s.step, s.ts_ns)
            SELECT s.step, s.name, s.ts_ns, s.dur_ns, s.end_ns, s.pid, s.tid,
                   sg.gpu_start_ns, sg.gpu_end_ns,
                   s.ts_ns = max(s.ts_ns) OVER () AS is_last
            FROM s LEFT JOIN sg USING (step, ts_ns) ORDER BY s.ts_ns"""
