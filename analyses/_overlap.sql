-- Shared private fragment: communication / compute overlap per (timeline, rank, step) group.
-- Spliced by analyses/_sql.py where an analysis's .sql says `-- @include _overlap`, inside a WITH list
-- right after the analysis's own CTE
--   _iv(timeline, rank, step, ts_ns, end_ns, kernel_class)
-- and followed by the analysis's SELECT from _overlap_rows(timeline, rank, step, comm_count, comm_ns,
-- compute_ns, overlap_ns, overlap_pct, exposed_comm_ns). One fragment, so comm_comp_overlap and
-- exposed_comm cannot drift apart.
--
-- kernel_class: 'communication' and 'compute' are unioned into islands per layer; other classes (memory,
-- other) only make their group exist (a step with no communication still gets its row, comm_ns = 0).
_groups AS (SELECT DISTINCT timeline, rank, step FROM _iv),
_layers AS (SELECT kernel_class AS layer, * FROM _iv WHERE kernel_class IN ('communication', 'compute')),
-- @include _islands
-- sweep over island edges: +1/-1 for communication, +2/-2 for compute; islands of one layer never overlap,
-- so state 3 = both running. Ends sort before starts at the same t: touching intervals do not overlap.
_edges AS (
  SELECT timeline, rank, step, start_ns AS t, CASE layer WHEN 'communication' THEN 1 ELSE 2 END AS d FROM _islands
  UNION ALL
  SELECT timeline, rank, step, end_ns, CASE layer WHEN 'communication' THEN -1 ELSE -2 END FROM _islands
),
_sweep AS (
  SELECT timeline, rank, step, t,
         sum(d) OVER (PARTITION BY timeline, rank, step ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS state,
         lead(t) OVER (PARTITION BY timeline, rank, step ORDER BY t, d) AS next_t
  FROM _edges
),
_overlap AS (
  SELECT timeline, rank, step, sum(next_t - t) FILTER (WHERE state = 3) AS overlap_ns FROM _sweep GROUP BY ALL
),
_sums AS (
  SELECT timeline, rank, step,
         coalesce(sum(n) FILTER (WHERE layer = 'communication'), 0) AS comm_count,
         coalesce(sum(end_ns - start_ns) FILTER (WHERE layer = 'communication'), 0) AS comm_ns,
         coalesce(sum(end_ns - start_ns) FILTER (WHERE layer = 'compute'), 0) AS compute_ns
  FROM _islands GROUP BY ALL
),
_overlap_rows AS (
  SELECT g.timeline, g.rank, g.step,
         coalesce(s.comm_count, 0)::BIGINT AS comm_count,
         coalesce(s.comm_ns, 0)::BIGINT AS comm_ns,
         coalesce(s.compute_ns, 0)::BIGINT AS compute_ns,
         coalesce(o.overlap_ns, 0)::BIGINT AS overlap_ns,
         100.0 * coalesce(o.overlap_ns, 0) / nullif(s.comm_ns, 0) AS overlap_pct,
         (coalesce(s.comm_ns, 0) - coalesce(o.overlap_ns, 0))::BIGINT AS exposed_comm_ns
  FROM _groups g
  LEFT JOIN _sums s ON s.timeline = g.timeline AND s.rank = g.rank AND s.step IS NOT DISTINCT FROM g.step
  LEFT JOIN _overlap o ON o.timeline = g.timeline AND o.rank = g.rank AND o.step IS NOT DISTINCT FROM g.step
)
