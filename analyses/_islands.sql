-- Shared private fragment: merge overlapping intervals into islands, per (layer, timeline, rank, step).
-- Spliced by analyses/_sql.py where a .sql file says `-- @include _islands`, inside a WITH list right
-- after the includer's own CTE
--   _layers(layer, timeline, rank, step, ts_ns, end_ns, ...)
-- and defines _islands(layer, timeline, rank, step, island, start_ns, end_ns, n): n = intervals merged.
-- An interval starts a new island when it starts once every earlier one (by start) has ended: touching
-- intervals stay apart, the rule of analyses/intervals.py (the Python twin; tests/test_intervals.py checks
-- they agree). Lengths and the intervals counted (n) do not depend on it.
--
-- One sort of the intervals: each one's position (rn: the intervals before it) and the latest end before it
-- (prev_end_ns) come from one window (one frame: a row_number() of its own took a second sort). An island's end is the latest end before the next island's first interval (every earlier
-- island ended before that one began), or the partition's latest end for its last island; its n is the
-- distance to the next island's first interval. Only the islands' first intervals take a second window:
-- at 4,096 ranks x 4,300 CPU ops a sum of island lengths took 30 s with a window to number every interval
-- and a group by island, 6 s this way (docs/scale.md).
_flagged AS (
  SELECT layer, timeline, rank, step, ts_ns, end_ns,
         max(end_ns) OVER w AS prev_end_ns, count(*) OVER w AS rn
  FROM _layers
  WINDOW w AS (PARTITION BY layer, timeline, rank, step ORDER BY ts_ns, end_ns
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
_partition_ends AS (
  SELECT layer, timeline, rank, step, max(end_ns) AS last_end_ns, count(*) AS n_intervals
  FROM _layers GROUP BY layer, timeline, rank, step
),
_island_starts AS (
  SELECT f.layer, f.timeline, f.rank, f.step, f.ts_ns AS start_ns, f.rn,
         row_number() OVER p AS island,
         coalesce(lead(f.prev_end_ns) OVER p, e.last_end_ns) AS end_ns,
         coalesce(lead(f.rn) OVER p, e.n_intervals) - f.rn AS n
  FROM _flagged f
  JOIN _partition_ends e ON e.layer = f.layer AND e.timeline = f.timeline AND e.rank = f.rank
                        AND e.step IS NOT DISTINCT FROM f.step
  WHERE f.prev_end_ns IS NULL OR f.ts_ns >= f.prev_end_ns
  WINDOW p AS (PARTITION BY f.layer, f.timeline, f.rank, f.step ORDER BY f.rn)
),
_islands AS (
  SELECT layer, timeline, rank, step, island, start_ns, end_ns, n FROM _island_starts
),
