-- Idle time breakdown: each GPU stream's gaps between consecutive ops, split by cause.
--
-- A gap is the time between an op's start and the end of the previous op on the same stream. It is
-- host_wait when the op's launch call started after the previous op had ended (the CPU was late to
-- enqueue), kernel_wait when it is shorter than kernel_wait_threshold_ns (back-to-back launch latency),
-- other otherwise (waiting on another stream, an event, a sync). HolisticTraceAnalysis's definition
-- (threshold 30 us). Overlapping ops on one stream give no negative gap: gaps are clamped at 0.
--
-- @column rank               global rank
-- @column stream             GPU stream
-- @column op_count           GPU ops on the stream in scope
-- @column idle_ns            sum of all gaps, ns
-- @column host_wait_ns       gaps whose launch came after the previous op ended, ns
-- @column kernel_wait_ns     short gaps (< kernel_wait_threshold_ns) with the op already launched, ns
-- @column other_idle_ns      remaining gaps, ns
-- @column host_wait_pct      host_wait_ns / idle_ns, percent
-- @column kernel_wait_pct    kernel_wait_ns / idle_ns, percent
-- @column other_idle_pct     other_idle_ns / idle_ns, percent
WITH _ops AS (
  SELECT rank, stream, ts_ns, end_ns, launch_ts_ns,
         lag(end_ns) OVER (PARTITION BY rank, stream ORDER BY ts_ns, end_ns) AS prev_end_ns
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE dur_ns IS NOT NULL
),
_gaps AS (
  SELECT rank, stream, greatest(ts_ns - prev_end_ns, 0) AS gap_ns,
         CASE WHEN prev_end_ns IS NULL THEN NULL
              WHEN launch_ts_ns > prev_end_ns THEN 'host_wait'
              WHEN ts_ns - prev_end_ns < $kernel_wait_threshold_ns THEN 'kernel_wait'
              ELSE 'other' END AS category
  FROM _ops
)
SELECT rank, stream, count(*) AS op_count,
       coalesce(sum(gap_ns), 0)::BIGINT AS idle_ns,
       coalesce(sum(gap_ns) FILTER (WHERE category = 'host_wait'), 0)::BIGINT AS host_wait_ns,
       coalesce(sum(gap_ns) FILTER (WHERE category = 'kernel_wait'), 0)::BIGINT AS kernel_wait_ns,
       coalesce(sum(gap_ns) FILTER (WHERE category = 'other'), 0)::BIGINT AS other_idle_ns,
       100.0 * coalesce(sum(gap_ns) FILTER (WHERE category = 'host_wait'), 0) / nullif(sum(gap_ns), 0) AS host_wait_pct,
       100.0 * coalesce(sum(gap_ns) FILTER (WHERE category = 'kernel_wait'), 0) / nullif(sum(gap_ns), 0) AS kernel_wait_pct,
       100.0 * coalesce(sum(gap_ns) FILTER (WHERE category = 'other'), 0) / nullif(sum(gap_ns), 0) AS other_idle_pct
FROM _gaps
GROUP BY rank, stream
ORDER BY rank, stream
