-- What fills the memory at its peak: memory_peak's peak (the first event at the largest Total Allocated) per
-- rank and device, split into parameters, gradients, optimizer state, activations, communication buffers and
-- other. The six add up to memory_peak's peak_allocated_bytes exactly: each live block at the peak has one
-- category, and the bytes allocated before profiling started (Total Allocated minus the live known blocks) are
-- split by the model state the trace shows. How a block gets its category, and how the bytes allocated before
-- profiling are split: analyses/_memory_blocks.sql's header (docs/analyses.md, Memory).
--
-- @column rank           global rank
-- @column device_type    0 = CPU, 1 = CUDA
-- @column device_id      device index (-1 = CPU)
-- @column category       parameters | gradients | optimizer_state | activations | communication_buffers | other
-- @column bytes_at_peak  bytes of the category live at the peak, bytes
-- @column peak_ts_ns     time of the peak (memory_peak's peak_allocated_ts_ns), trace clock ns
WITH
-- @include _memory_blocks
SELECT c.rank, c.device_type, c.device_id, c.category, c.bytes AS bytes_at_peak, c.ts_ns AS peak_ts_ns
FROM _mem_category_long c JOIN _mem_peak p ON p.rank = c.rank AND p.peak_event_id = c.event_id
ORDER BY c.rank, c.device_type, c.device_id, c.category_order
