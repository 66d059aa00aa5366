-- Private (depgraph): the GPU ops (kernels, memcpys, memsets) of the graph's ranks with a duration.
SELECT rank, pid, tid, event_id, name, ts_ns, dur_ns, correlation FROM _events
WHERE rank IN (SELECT unnest($ranks::BIGINT[])) AND ph = 'X' AND cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')
  AND dur_ns IS NOT NULL AND dur_ns >= 0 AND ts_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
