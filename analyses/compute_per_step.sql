-- Compute per step and rank: the union of the rank's compute in each profiled step (the rank's last step,
-- often cut short by the profiler, left out), the figure doctor compares pipeline stages by. A rank with
-- kernels: its kernels that are not communication (kernel_classes.py's COMM_KERNEL_PATTERN, bound by the
-- caller), by the step of their launch. A rank without: its CPU operators outside collective calls
-- (c10d::*; a stage blocked in a recv runs no operator). Nested operators count once.
--
-- @column rank        global rank
-- @column step        ProfilerStep#N
-- @column timeline    gpu: kernels; cpu: CPU operators of a rank without kernels
-- @column compute_ns  length of the union of the step's compute, ns
WITH _steps_in AS (SELECT rank, step FROM steps WHERE NOT is_last AND ($rank IS NULL OR rank = $rank)),
_gpu_ranks AS (SELECT DISTINCT rank FROM kernels),
_layers AS (
  SELECT 'compute' AS layer, 'gpu' AS timeline, k.rank, k.step, k.ts_ns, k.ts_ns + k.dur_ns AS end_ns
  FROM kernels k SEMI JOIN _steps_in USING (rank, step)
  WHERE k.dur_ns > 0 AND NOT regexp_matches(k.name, $comm_kernel_pattern)
  UNION ALL
  SELECT 'compute', 'cpu', o.rank, o.step, o.ts_ns, o.ts_ns + o.dur_ns
  FROM cpu_ops o SEMI JOIN _steps_in USING (rank, step)
  WHERE o.dur_ns > 0 AND o.name NOT LIKE 'c10d::%' AND o.rank NOT IN (SELECT rank FROM _gpu_ranks)
),
-- @include _islands
_per_step AS (
  SELECT rank, step, timeline, sum(end_ns - start_ns)::BIGINT AS compute_ns FROM _islands GROUP BY rank, step, timeline
)
SELECT rank, step, timeline, compute_ns FROM _per_step ORDER BY rank, step
