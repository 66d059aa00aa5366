-- Shared private macros: the shapes and element sizes of an operator's arguments as Kineto records them
-- (Input Dims, Input type). Spliced where a .sql file says `-- @include _tensor_args` (the collectives views'
-- sizes, memory_breakdown's parameter bytes); one statement per ';' at a line end.

-- _tensor_dtype_bytes(dtype): element size of a dtype as PyTorch, NCCL args or NCCL kernel names spell it.
-- 1-byte and 8-byte spellings are tested before the 4-byte ones they contain ('int8', 'int64' hold 'int').
CREATE OR REPLACE TEMP MACRO _tensor_dtype_bytes(d) AS (
  CASE
    WHEN d IS NULL THEN NULL
    WHEN regexp_matches(lower(d), 'float8|fp8|e4m3|e5m2|^f8') THEN 1
    WHEN regexp_matches(lower(d), 'bfloat16|bf16|half|float16|f16|int16|short|^[iu]16$') THEN 2
    WHEN regexp_matches(lower(d), 'double|float64|f64|int64|long|^[iu]64$') THEN 8
    WHEN regexp_matches(lower(d), 'int8|char|bool|byte|^[iu]8$') THEN 1
    WHEN regexp_matches(lower(d), 'float|f32|int|^[iu]32$') THEN 4
  END
);

-- _tensor_arg_nelems(dims, i): elements of argument i of an Input Dims JSON list: a shape ([4, 2048]) or a
-- tensor list ([[4, 2048], [8]], summed); NULL when the argument is not a tensor.
CREATE OR REPLACE TEMP MACRO _tensor_arg_nelems(dims, i) AS (
  CASE
    WHEN json_type(dims, '$[' || i || '][0]') = 'ARRAY' THEN
      list_sum(list_transform(TRY_CAST(json_extract(dims, '$[' || i || ']')::VARCHAR AS BIGINT[][]),
                              lambda s: list_aggregate(s, 'product')::BIGINT))::BIGINT
    WHEN json_type(dims, '$[' || i || '][0]') IN ('BIGINT', 'UBIGINT') THEN
      list_aggregate(TRY_CAST(json_extract(dims, '$[' || i || ']')::VARCHAR AS BIGINT[]), 'product')::BIGINT
  END
);

-- _tensor_first_type(types): the first tensor element type of an Input type JSON list, '' and TensorList skipped.
CREATE OR REPLACE TEMP MACRO _tensor_first_type(types) AS (
  list_filter(TRY_CAST(types AS VARCHAR[]), lambda t: t NOT IN ('', 'TensorList', 'Scalar', 'ScalarList', 'GenericList'))[1]
);
