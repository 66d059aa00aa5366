-- Private (critical_path): GPU ops launched inside [start_ns, end_ns) on one rank, with their class.
SELECT event_id, name, stream, ts_ns, end_ns, correlation, kernel_class
FROM _gpu_ops_classified
WHERE rank = $rank AND launch_ts_ns >= $start_ns AND launch_ts_ns < $end_ns AND dur_ns IS NOT NULL
ORDER BY stream, ts_ns, event_id
