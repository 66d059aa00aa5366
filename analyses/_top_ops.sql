-- Shared private fragment: which CPU operators are top-level, inside no earlier operator on their thread.
-- Spliced by analyses/_sql.py where a .sql file says `-- @include _top_ops`, inside a WITH list right after
-- the includer's own CTE
--   _cpu(rank, tid, ts_ns, end_ns, ...)
-- and defines _top_flag(_cpu's columns, is_top). Operators on a thread nest; one that starts as the earlier
-- ones end is top-level (touching intervals stay apart, the rule of analyses/intervals.py).
_top_flag AS (
  SELECT *, coalesce(ts_ns >= max(end_ns) OVER (PARTITION BY rank, tid ORDER BY ts_ns, end_ns DESC
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS is_top
  FROM _cpu
),
