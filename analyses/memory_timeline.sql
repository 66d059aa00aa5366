-- Memory timeline: allocated and reserved bytes over time from the [memory] instant events.
--
-- One row per allocation or free, per rank and device (the allocator's totals after the event). On a CPU device
-- the total is the allocator's less the blocks whose free the trace lost (analyses/_memory_events.sql: a free on a
-- thread the profiler does not follow, such as gloo's workers, writes no event and leaves Total Allocated high).
--
-- @column rank             global rank
-- @column device_type      0 = CPU, 1 = CUDA
-- @column device_id        device index (-1 = CPU)
-- @column ts_ns            time of the allocation or free, trace clock ns
-- @column delta_bytes      bytes allocated (negative: freed)
-- @column allocated_bytes  total allocated after the event, bytes
-- @column reserved_bytes   total reserved by the caching allocator after the event, bytes
-- @column lost_free_bytes  bytes of blocks whose free the trace lost, taken off allocated_bytes by then (CPU), bytes
WITH
-- @include _memory_events
_timeline AS (
  SELECT rank, device_type, device_id, ts_ns, event_id, bytes AS delta_bytes, total_allocated AS allocated_bytes,
         total_reserved AS reserved_bytes, lost_free_bytes
  FROM _mem_events
)
SELECT * EXCLUDE (event_id) FROM _timeline
ORDER BY rank, device_type, device_id, ts_ns, event_id
