-- Shared private fragment: the ops a per-rank (or per-step) timeline analysis works on.
-- Spliced by analyses/_sql.py at `-- @include _timeline_ops` as the first CTE of a WITH list; defines
--   _iv(timeline, rank, step, ts_ns, end_ns, kernel_class)
-- GPU ops in scope; for a rank without GPU activity (and $cpu_fallback), its CPU work instead.
-- step is NULL unless $by_step.
_iv AS (
  SELECT 'gpu' AS timeline, rank, CASE WHEN $by_step THEN step END AS step, ts_ns, end_ns, kernel_class
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE (NOT $by_step OR step IS NOT NULL) AND dur_ns IS NOT NULL
  UNION ALL
  SELECT 'cpu', rank, CASE WHEN $by_step THEN step END, ts_ns, end_ns, kernel_class
  FROM _cpu_work_in_scope($rank, $step, $by_step)
  WHERE $cpu_fallback AND (NOT $by_step OR step IS NOT NULL)
    AND rank NOT IN (SELECT DISTINCT rank FROM _gpu_ops_classified)
),
