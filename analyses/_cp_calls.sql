-- Private (critical_path): CUDA/HIP runtime and driver calls of one rank inside [start_ns, end_ns).
SELECT event_id, tid, name, ts_ns, end_ns, correlation
FROM events
WHERE rank = $rank AND ph = 'X' AND is_device_runtime(cat) AND ts_ns >= $start_ns AND ts_ns < $end_ns
ORDER BY tid, ts_ns, event_id
