-- Shared private fragment: the allocator's peak per rank and device, the one rule memory_peak and
-- memory_breakdown (through _memory_blocks) both read. Spliced by analyses/_sql.py where a .sql file says
-- `-- @include _memory_peak`, inside a WITH list right after the includer's CTE
--   _mem_events (the memory events in scope, _memory_events.sql)
-- and defines _mem_peak(rank, device_type, device_id, event_count, peak_allocated_bytes, peak_ts_ns,
-- peak_event_id, peak_reserved_bytes, allocated_bytes_end). The peak is the first event reaching the largest
-- Total Allocated: the earliest time, and at one time (traces in us hold many events a microsecond) the
-- smallest event_id, the order the allocator wrote them.
_mem_peak AS (
  SELECT rank, device_type, device_id, count(*) AS event_count,
         max(total_allocated) AS peak_allocated_bytes,
         arg_max(ts_ns, (total_allocated, -ts_ns, -event_id)) AS peak_ts_ns,
         arg_max(event_id, (total_allocated, -ts_ns, -event_id)) AS peak_event_id,
         max(total_reserved) AS peak_reserved_bytes,
         arg_max(total_allocated, (ts_ns, event_id)) AS allocated_bytes_end
  FROM _mem_events
  GROUP BY rank, device_type, device_id
),
