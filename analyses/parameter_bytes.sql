-- The bytes of the parameters each rank's optimizer updates, from the recorded shapes (analyses/_parameter_bytes.sql):
-- what the memory attribution splits the bytes allocated before profiling by, and what a re-layout re-shards.
--
-- @column rank                     global rank
-- @column parameter_bytes          parameter bytes from the recorded shapes, bytes (NULL: no Input Dims on the
--                                  optimizer's update nor on AccumulateGrad)
-- @column parameter_bytes_source   optimizer (its update's first input in the first step) | accumulate_grad (the
--                                  gradients of the first step that has them) | NULL
WITH
-- @include _parameter_bytes
SELECT rank, parameter_bytes, parameter_bytes_source FROM _param_bytes ORDER BY rank
