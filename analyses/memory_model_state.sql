-- The model state a trace shows per rank: the parameter bytes its shapes give and its optimizer, which split the
-- bytes allocated before profiling started in memory_breakdown (analyses/_memory_blocks.sql's header: P).
--
-- @column rank                          global rank
-- @column parameter_bytes               parameter bytes from the recorded shapes, bytes (NULL: the trace has no shapes
--                                       of them: no Input Dims on the optimizer's update nor on AccumulateGrad)
-- @column parameter_bytes_source        optimizer (its update's first input in the first step) | accumulate_grad
--                                       (the gradients of the first step that has them) | NULL
-- @column adam                          the optimizer is Adam or AdamW (Optimizer.step#Adam.step / #AdamW.step): its
--                                       state is two tensors a parameter's size
-- @column device_type                   the device the state is on: the rank's largest peak (0 = CPU, 1 = CUDA)
-- @column device_id                     its index (-1 = CPU)
-- @column pre_profiling_bytes_at_peak   bytes allocated before profiling still live at that device's peak, bytes
WITH
-- @include _memory_blocks
SELECT m.rank, m.parameter_bytes, m.parameter_bytes_source, m.adam, d.device_type, d.device_id,
       c.pre_profiling_bytes AS pre_profiling_bytes_at_peak
FROM _mem_model_state m
JOIN _mem_state_device d ON d.rank = m.rank
JOIN _mem_peak p ON p.rank = d.rank AND p.device_type = d.device_type AND p.device_id = d.device_id
JOIN _mem_category_bytes c ON c.rank = p.rank AND c.event_id = p.peak_event_id
ORDER BY m.rank
