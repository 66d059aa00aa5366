-- Kernel launch outliers: every GPU op with a short-op/long-launch, long runtime call or long delay.
--
-- Same definitions as kernel_launch_stats; one row per outlying op, longest delay first.
--
-- @column rank                    global rank
-- @column step                    ProfilerStep#N of the launch call (NULL outside steps)
-- @column stream                  GPU stream
-- @column correlation             launch <-> op correlation id
-- @column name                    GPU op name
-- @column launch_name             runtime call
-- @column ts_ns                   GPU op start, trace clock ns
-- @column dur_ns                  GPU op duration, ns
-- @column runtime_call_ns         launch call duration, ns
-- @column launch_delay_ns         max(0, op start - launch call end), ns
-- @column short_op_long_launch    op shorter than its launch call
-- @column long_runtime_call       call longer than runtime_cutoff_ns
-- @column long_launch_delay       delay longer than launch_delay_cutoff_ns
WITH _l AS (
  SELECT rank, step, stream, correlation, name, launch_name, ts_ns, dur_ns, launch_dur_ns AS runtime_call_ns,
         greatest(ts_ns - (launch_ts_ns + launch_dur_ns), 0) AS launch_delay_ns
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE launch_ts_ns IS NOT NULL
),
_flags AS (
  SELECT *, dur_ns < runtime_call_ns AS short_op_long_launch, runtime_call_ns > $runtime_cutoff_ns AS long_runtime_call,
         launch_delay_ns > $launch_delay_cutoff_ns AS long_launch_delay
  FROM _l
)
SELECT * FROM _flags
WHERE short_op_long_launch OR long_runtime_call OR long_launch_delay
ORDER BY launch_delay_ns DESC, runtime_call_ns DESC, rank, ts_ns
