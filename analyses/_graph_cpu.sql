-- Private (depgraph): the CPU events of the graph's ranks with a duration: CPU ops, runtime and driver
-- calls, and the gloo:* / nccl:* annotations (a gloo runloop's work on a collective).
SELECT rank, pid, tid, event_id, cat, name, ts_ns, dur_ns, correlation FROM _events
WHERE rank IN (SELECT unnest($ranks::BIGINT[])) AND ph = 'X' AND dur_ns IS NOT NULL AND ts_ns IS NOT NULL
  AND pid IS NOT NULL AND tid IS NOT NULL AND dur_ns >= 0
  AND (cat = 'cpu_op' OR is_device_runtime(cat)
       OR (cat = 'user_annotation' AND (name LIKE 'gloo:%' OR name LIKE 'nccl:%')))
