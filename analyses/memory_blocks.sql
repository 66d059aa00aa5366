-- Every allocator block the trace records: when it was allocated, when it ended, its size and its category, by
-- the attribution memory_breakdown reads (analyses/_memory_blocks.sql). A block ends at the next event at its
-- address (the free, or the allocation that reuses the address where the free was lost); on a CPU device a process
-- group's own buffer with neither ends after its transfer (analyses/_memory_events.sql); NULL: live to the end.
-- Bytes allocated before profiling have no block (memory_breakdown splits them). The memory what-ifs
-- (replay/memory.py) move, resize and drop these blocks to predict a new peak.
--
-- @column rank          global rank
-- @column device_type   0 = CPU, 1 = CUDA
-- @column device_id     device index (-1 = CPU)
-- @column tid           thread that allocated it
-- @column alloc_ts_ns   allocation time, trace clock ns
-- @column end_ts_ns     time it ended (NULL: live at the trace's end), trace clock ns
-- @column bytes         size, bytes
-- @column category      parameters | gradients | optimizer_state | activations | communication_buffers | other
WITH
-- @include _memory_blocks
_blocks AS (
  SELECT b.rank, b.device_type, b.device_id, b.tid, b.alloc_ts_ns, b.alloc_event_id, b.end_ts_ns, b.bytes, c.category
  FROM _mem_blocks b
  JOIN _mem_block_category c ON c.rank = b.rank AND c.alloc_event_id = b.alloc_event_id
)
SELECT * EXCLUDE (alloc_event_id) FROM _blocks
ORDER BY rank, device_type, device_id, alloc_ts_ns, alloc_event_id
