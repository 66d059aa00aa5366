-- Shared private fragment: the [memory] events in scope, with each CPU event's Total Allocated less the blocks
-- whose free the trace lost, the one series every memory analysis reads (memory_timeline, memory_peak, and
-- memory_breakdown's blocks through _memory_blocks). Spliced by analyses/_sql.py where a .sql file says
-- `-- @include _memory_events`, at the head of a WITH list; needs $rank. Defines
--   _mem_events  the memory table's rows in scope, total_allocated corrected, and lost_free_bytes: the bytes taken
--                off it (0 on a CUDA device)
--
-- PyTorch's CPU allocator reports a free to the profiler only from a thread the profiler follows, and its Total
-- Allocated comes down only there (c10::ProfiledCPUMemoryReporter: a free on any other thread, such as gloo's
-- worker threads dropping a collective's buffer, writes no event and leaves the block's bytes counted). A lost
-- free shows where the block's address is allocated again with no free between: the block ended by then, and from
-- that event on its bytes are off the total. A block whose address is never allocated again stays counted (its
-- free may have been lost too). The CUDA caching allocator keeps its totals on every thread: its events are kept
-- as written.
_mem_raw AS (SELECT * FROM memory WHERE ($rank IS NULL OR rank = $rank)),
_mem_lost AS (
  SELECT rank, device_type, device_id, next_event_id AS event_id, sum(bytes) AS lost_bytes
  FROM (SELECT rank, device_type, device_id, bytes, lead(event_id) OVER w AS next_event_id,
               lead(bytes) OVER w AS next_bytes
        FROM _mem_raw WHERE device_type = 0
        WINDOW w AS (PARTITION BY rank, device_type, device_id, addr ORDER BY ts_ns, event_id))
  WHERE bytes > 0 AND next_bytes > 0
  GROUP BY ALL
),
_mem_events AS (
  SELECT e.* REPLACE (e.total_allocated - e.lost_free_bytes AS total_allocated)
  FROM (SELECT e.*, coalesce(sum(l.lost_bytes) OVER (PARTITION BY e.rank, e.device_type, e.device_id
                                                    ORDER BY e.ts_ns, e.event_id ROWS UNBOUNDED PRECEDING), 0)::BIGINT
                    AS lost_free_bytes
        FROM _mem_raw e
        LEFT JOIN _mem_lost l ON l.rank = e.rank AND l.device_type = e.device_type AND l.device_id = e.device_id
                             AND l.event_id = e.event_id) e
),
