-- What fills the memory over time: the bytes of each category (parameters, gradients, optimizer state,
-- activations, communication buffers, other) per rank and device, after every [memory] event that changes it.
-- The same block attribution as memory_breakdown (analyses/_memory_blocks.sql): at every event the six add up
-- to the allocator's Total Allocated, and at memory_peak's peak they are memory_breakdown's rows.
--
-- One row per category at a rank's first event, then one per event and category whose bytes changed; a
-- category holds its bytes until its next row.
--
-- @column rank         global rank
-- @column device_type  0 = CPU, 1 = CUDA
-- @column device_id    device index (-1 = CPU)
-- @column ts_ns        time of the allocation or free, trace clock ns
-- @column category     parameters | gradients | optimizer_state | activations | communication_buffers | other
-- @column bytes        bytes of the category live after the event, bytes
WITH
-- @include _memory_blocks
_changes AS (
  SELECT *, lag(bytes) OVER (PARTITION BY rank, device_type, device_id, category ORDER BY ts_ns, event_id) AS prev_bytes
  FROM _mem_category_long
)
SELECT rank, device_type, device_id, ts_ns, category, bytes
FROM _changes
WHERE prev_bytes IS NULL OR bytes <> prev_bytes
ORDER BY rank, device_type, device_id, ts_ns, event_id, category_order
