-- Queue length over time: GPU ops launched but not yet started, per rank and stream.
--
-- +1 at each launch call's start, -1 at each GPU op's start (HolisticTraceAnalysis's definition);
-- at equal times the start is counted first. One row per change.
--
-- @column rank          global rank
-- @column stream        GPU stream
-- @column ts_ns         time of the change, trace clock ns
-- @column queue_length  ops queued on the stream from ts_ns on
WITH _ev AS (
  SELECT rank, stream, launch_ts_ns AS ts_ns, 1 AS delta FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE launch_ts_ns IS NOT NULL
  UNION ALL
  SELECT rank, stream, ts_ns, -1 FROM _gpu_ops_in_scope($rank, $step, $drop_last_step) WHERE launch_ts_ns IS NOT NULL
)
SELECT rank, stream, ts_ns,
       sum(delta) OVER (PARTITION BY rank, stream ORDER BY ts_ns, delta ROWS UNBOUNDED PRECEDING) AS queue_length
FROM _ev
ORDER BY rank, stream, ts_ns, queue_length
