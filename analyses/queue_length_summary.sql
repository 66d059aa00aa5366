-- Queue length summary per rank and stream, and time spent with a full launch queue.
--
-- From the queue_length series: the time-weighted mean, percentiles over the changes, the maximum, and
-- the time the queue held at least queue_limit ops (the CUDA launch queue blocks the CPU at ~1024).
--
-- @column rank              global rank
-- @column stream            GPU stream
-- @column span_ns           first change to last change, ns
-- @column mean_queue_length time-weighted mean queue length
-- @column p50_queue_length  median over the changes
-- @column p95_queue_length  95th percentile over the changes
-- @column max_queue_length  largest queue length
-- @column full_queue_ns     time with queue_length >= queue_limit, ns
-- @column full_queue_pct    full_queue_ns / span_ns, percent
WITH _ev AS (
  SELECT rank, stream, launch_ts_ns AS ts_ns, 1 AS delta FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE launch_ts_ns IS NOT NULL
  UNION ALL
  SELECT rank, stream, ts_ns, -1 FROM _gpu_ops_in_scope($rank, $step, $drop_last_step) WHERE launch_ts_ns IS NOT NULL
),
_q AS (
  SELECT rank, stream, ts_ns,
         sum(delta) OVER (PARTITION BY rank, stream ORDER BY ts_ns, delta ROWS UNBOUNDED PRECEDING) AS queue_length,
         coalesce(lead(ts_ns) OVER (PARTITION BY rank, stream ORDER BY ts_ns, delta), ts_ns) - ts_ns AS held_ns
  FROM _ev
)
SELECT rank, stream, max(ts_ns) - min(ts_ns) AS span_ns,
       sum(queue_length * held_ns) / nullif(sum(held_ns), 0) AS mean_queue_length,
       quantile_cont(queue_length, 0.5) AS p50_queue_length, quantile_cont(queue_length, 0.95) AS p95_queue_length,
       max(queue_length) AS max_queue_length,
       coalesce(sum(held_ns) FILTER (WHERE queue_length >= $queue_limit), 0)::BIGINT AS full_queue_ns,
       100.0 * coalesce(sum(held_ns) FILTER (WHERE queue_length >= $queue_limit), 0) / nullif(max(ts_ns) - min(ts_ns), 0)
         AS full_queue_pct
FROM _q
GROUP BY rank, stream
ORDER BY rank, stream
