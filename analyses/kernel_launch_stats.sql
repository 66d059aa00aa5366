-- Kernel launch statistics: launch delay and runtime-call duration per rank and launch call.
--
-- launch delay = max(0, GPU op start - end of its launching runtime call) (HolisticTraceAnalysis's
-- definition); runtime call = duration of that call. Outliers: a GPU op shorter than its launch call
-- (the CPU cannot keep the GPU fed), a call longer than runtime_cutoff_ns, a delay longer than
-- launch_delay_cutoff_ns. Ops without a launch call (uncorrelated) are left out.
--
-- @column rank                          global rank
-- @column launch_name                   runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...)
-- @column op_count                      GPU ops launched by that call
-- @column launch_delay_mean_ns          mean launch delay, ns
-- @column launch_delay_p50_ns           median launch delay, ns
-- @column launch_delay_p95_ns           95th percentile launch delay, ns
-- @column launch_delay_max_ns           longest launch delay, ns
-- @column runtime_call_mean_ns          mean runtime call duration, ns
-- @column runtime_call_p95_ns           95th percentile runtime call duration, ns
-- @column runtime_call_max_ns           longest runtime call, ns
-- @column short_op_long_launch_count    ops shorter than their launch call
-- @column long_runtime_call_count       calls longer than runtime_cutoff_ns
-- @column long_launch_delay_count       delays longer than launch_delay_cutoff_ns
WITH _l AS (
  SELECT rank, launch_name, dur_ns, launch_dur_ns AS runtime_call_ns,
         greatest(ts_ns - (launch_ts_ns + launch_dur_ns), 0) AS launch_delay_ns
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE launch_ts_ns IS NOT NULL
)
SELECT rank, launch_name, count(*) AS op_count,
       avg(launch_delay_ns) AS launch_delay_mean_ns, quantile_cont(launch_delay_ns, 0.5) AS launch_delay_p50_ns,
       quantile_cont(launch_delay_ns, 0.95) AS launch_delay_p95_ns, max(launch_delay_ns) AS launch_delay_max_ns,
       avg(runtime_call_ns) AS runtime_call_mean_ns, quantile_cont(runtime_call_ns, 0.95) AS runtime_call_p95_ns,
       max(runtime_call_ns) AS runtime_call_max_ns,
       count(*) FILTER (WHERE dur_ns < runtime_call_ns) AS short_op_long_launch_count,
       count(*) FILTER (WHERE runtime_call_ns > $runtime_cutoff_ns) AS long_runtime_call_count,
       count(*) FILTER (WHERE launch_delay_ns > $launch_delay_cutoff_ns) AS long_launch_delay_count
FROM _l
GROUP BY rank, launch_name
ORDER BY rank, op_count DESC, launch_name
