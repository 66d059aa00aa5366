-- Memory peak per rank and device from the [memory] instant events.
--
-- @column rank                  global rank
-- @column device_type           0 = CPU, 1 = CUDA
-- @column device_id             device index (-1 = CPU)
-- @column event_count           allocations and frees
-- @column peak_allocated_bytes  largest total allocated, bytes
-- @column peak_allocated_ts_ns  first time it was reached, trace clock ns
-- @column peak_reserved_bytes   largest total reserved, bytes
-- @column allocated_bytes_end   total allocated after the last event, bytes
SELECT rank, device_type, device_id, count(*) AS event_count,
       max(total_allocated) AS peak_allocated_bytes,
       arg_max(ts_ns, (total_allocated, -ts_ns)) AS peak_allocated_ts_ns,
       max(total_reserved) AS peak_reserved_bytes,
       arg_max(total_allocated, (ts_ns, event_id)) AS allocated_bytes_end
FROM memory
WHERE ($rank IS NULL OR rank = $rank)
GROUP BY rank, device_type, device_id
ORDER BY rank, device_type, device_id
