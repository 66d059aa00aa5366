-- Shared private fragment: merge overlapping intervals into islands, per (layer, timeline, rank, step).
-- Spliced by analyses/_sql.py where a .sql file says `-- @include _islands`, inside a WITH list right
-- after the includer's own CTE
--   _layers(layer, timeline, rank, step, ts_ns, end_ns, ...)
-- and defines _islands(layer, timeline, rank, step, island, start_ns, end_ns, n): n = intervals merged.
-- An interval starts a new island when it starts once every earlier one (by start) has ended: touching
-- intervals stay apart, the rule of analyses/intervals.py (the Python twin; tests/test_intervals.py checks
-- they agree). Lengths and the intervals counted (n) do not depend on it.
_flagged AS (
  SELECT *, coalesce(ts_ns >= max(end_ns) OVER (PARTITION BY layer, timeline, rank, step ORDER BY ts_ns, end_ns
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS starts_island
  FROM _layers
),
_numbered AS (
  SELECT *, sum(starts_island::INTEGER) OVER (PARTITION BY layer, timeline, rank, step ORDER BY ts_ns, end_ns
                                              ROWS UNBOUNDED PRECEDING) AS island
  FROM _flagged
),
_islands AS (
  SELECT layer, timeline, rank, step, island, min(ts_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS n
  FROM _numbered GROUP BY layer, timeline, rank, step, island
),
