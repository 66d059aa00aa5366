-- Communication-computation overlap: how much of each rank's (or step's) communication runs under compute.
--
-- comm_ns = union of communication kernels; overlap_ns = time when a communication kernel and a compute
-- kernel run at the same time; overlap_pct = overlap_ns / comm_ns (HolisticTraceAnalysis's ratio);
-- exposed_comm_ns = comm_ns - overlap_ns, the communication time nothing hides. Ranks without GPU ops
-- get the same figures over CPU ops (timeline = 'cpu': c10d/gloo ops against the other CPU ops).
--
-- @column rank             global rank
-- @column step             ProfilerStep#N (by_step), NULL for the whole rank
-- @column timeline         gpu: GPU ops; cpu: CPU ops of a rank without GPU activity
-- @column comm_count       communication kernels (or ops) counted
-- @column comm_ns          union of communication kernels, ns
-- @column compute_ns       union of compute kernels, ns
-- @column overlap_ns       time communication and compute both run, ns
-- @column overlap_pct      overlap_ns / comm_ns, percent (NULL without communication)
-- @column exposed_comm_ns  comm_ns - overlap_ns, ns
WITH _iv AS (
  SELECT 'gpu' AS timeline, rank, CASE WHEN $by_step THEN step END AS step, ts_ns, end_ns, kernel_class
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE (NOT $by_step OR step IS NOT NULL) AND dur_ns IS NOT NULL
  UNION ALL
  SELECT 'cpu', rank, CASE WHEN $by_step THEN step END, ts_ns, end_ns, kernel_class
  FROM _cpu_work_in_scope($rank, $step)
  WHERE $cpu_fallback AND (NOT $by_step OR step IS NOT NULL)
    AND rank NOT IN (SELECT DISTINCT rank FROM _gpu_ops_classified)
),
_groups AS (SELECT DISTINCT timeline, rank, step FROM _iv),
_layers AS (SELECT kernel_class AS layer, * FROM _iv WHERE kernel_class IN ('communication', 'compute')),
_flagged AS (
  SELECT *, coalesce(ts_ns > max(end_ns) OVER (PARTITION BY layer, timeline, rank, step ORDER BY ts_ns, end_ns
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
  FROM _numbered GROUP BY ALL
),
-- sweep over island edges: +1/-1 for communication, +2/-2 for compute; state 3 = both running
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
)
SELECT g.rank, g.step, g.timeline,
       coalesce(s.comm_count, 0)::BIGINT AS comm_count,
       coalesce(s.comm_ns, 0)::BIGINT AS comm_ns,
       coalesce(s.compute_ns, 0)::BIGINT AS compute_ns,
       coalesce(o.overlap_ns, 0)::BIGINT AS overlap_ns,
       100.0 * coalesce(o.overlap_ns, 0) / nullif(s.comm_ns, 0) AS overlap_pct,
       (coalesce(s.comm_ns, 0) - coalesce(o.overlap_ns, 0))::BIGINT AS exposed_comm_ns
FROM _groups g
LEFT JOIN _sums s ON s.timeline = g.timeline AND s.rank = g.rank AND s.step IS NOT DISTINCT FROM g.step
LEFT JOIN _overlap o ON o.timeline = g.timeline AND o.rank = g.rank AND o.step IS NOT DISTINCT FROM g.step
ORDER BY g.rank, g.step NULLS FIRST, g.timeline
