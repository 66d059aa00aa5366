-- Temporal breakdown: each rank's (or step's) GPU time split into idle, compute and non-compute.
--
-- Over the kernel span (first GPU op start to last GPU op end): idle = span - union(all GPU ops);
-- compute = union(compute kernels); non_compute = span - compute - idle, i.e. time when only
-- communication / memory / other ops run. This is HolisticTraceAnalysis's definition; by default the
-- whole trace is kept (HTA drops the last step: drop_last_step). With by_step, ops are grouped by the
-- ProfilerStep of their launching call. Ranks with no GPU op at all get the same figures over their
-- CPU operators and annotations (timeline = 'cpu'; c10d/gloo ops are the non-compute part).
--
-- @column rank             global rank
-- @column step             ProfilerStep#N (by_step), NULL for the whole rank
-- @column timeline         gpu: GPU ops; cpu: CPU ops of a rank without GPU activity
-- @column op_count         GPU ops (or CPU ops) counted
-- @column start_ns         start of the first op, trace clock ns
-- @column end_ns           end of the last op, trace clock ns
-- @column kernel_span_ns   end_ns - start_ns (HTA's kernel_time), ns
-- @column busy_ns          union of all ops, ns
-- @column idle_ns          kernel_span_ns - busy_ns, ns
-- @column compute_ns       union of compute kernels, ns
-- @column non_compute_ns   kernel_span_ns - compute_ns - idle_ns, ns
-- @column idle_pct         idle_ns / kernel_span_ns, percent
-- @column compute_pct      compute_ns / kernel_span_ns, percent
-- @column non_compute_pct  non_compute_ns / kernel_span_ns, percent
WITH
-- @include _timeline_ops
-- the 'all' layer holds every op, the 'compute' layer only compute ops; each is merged into islands
_layers AS (
  SELECT 'all' AS layer, * FROM _iv
  UNION ALL
  SELECT 'compute', * FROM _iv WHERE kernel_class = 'compute'
),
-- @include _islands
_union AS (
  SELECT timeline, rank, step,
         min(start_ns) FILTER (WHERE layer = 'all') AS start_ns,
         max(end_ns) FILTER (WHERE layer = 'all') AS end_ns,
         sum(end_ns - start_ns) FILTER (WHERE layer = 'all') AS busy_ns,
         coalesce(sum(end_ns - start_ns) FILTER (WHERE layer = 'compute'), 0) AS compute_ns
  FROM _islands GROUP BY ALL
),
_counts AS (SELECT timeline, rank, step, count(*) AS op_count FROM _iv GROUP BY ALL),
_spans AS (
  SELECT u.*, c.op_count, u.end_ns - u.start_ns AS kernel_span_ns
  FROM _union u JOIN _counts c ON c.timeline = u.timeline AND c.rank = u.rank AND c.step IS NOT DISTINCT FROM u.step
)
SELECT rank, step, timeline, op_count, start_ns, end_ns, kernel_span_ns, busy_ns::BIGINT AS busy_ns,
       (kernel_span_ns - busy_ns)::BIGINT AS idle_ns,
       compute_ns::BIGINT AS compute_ns,
       (busy_ns - compute_ns)::BIGINT AS non_compute_ns,
       100.0 * (kernel_span_ns - busy_ns) / nullif(kernel_span_ns, 0) AS idle_pct,
       100.0 * compute_ns / nullif(kernel_span_ns, 0) AS compute_pct,
       100.0 * (busy_ns - compute_ns) / nullif(kernel_span_ns, 0) AS non_compute_pct
FROM _spans
ORDER BY rank, step NULLS FIRST, timeline
