-- Private (depgraph): the device ops (kernels, memcpys, memsets: tracekit/store/devices.py) of the graph's ranks
-- with a duration.
SELECT rank, pid, tid, event_id, name, ts_ns, dur_ns, correlation FROM _events
WHERE rank IN (SELECT unnest($ranks::BIGINT[])) AND ph = 'X' AND is_device_op(cat)
  AND dur_ns IS NOT NULL AND dur_ns >= 0 AND ts_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
