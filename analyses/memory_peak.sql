-- Memory peak per rank and device from the [memory] instant events. On a CPU device the totals are the
-- allocator's less the blocks whose free the trace lost (analyses/_memory_events.sql).
--
-- @column rank                  global rank
-- @column device_type           0 = CPU, 1 = CUDA
-- @column device_id             device index (-1 = CPU)
-- @column event_count           allocations and frees
-- @column peak_allocated_bytes  largest total allocated, bytes
-- @column peak_allocated_ts_ns  first time it was reached, trace clock ns
-- @column peak_reserved_bytes   largest total reserved, bytes
-- @column allocated_bytes_end   total allocated after the last event, bytes
WITH
-- @include _memory_events
-- @include _memory_peak
SELECT rank, device_type, device_id, event_count, peak_allocated_bytes, peak_ts_ns AS peak_allocated_ts_ns,
       peak_reserved_bytes, allocated_bytes_end
FROM _mem_peak
ORDER BY rank, device_type, device_id
