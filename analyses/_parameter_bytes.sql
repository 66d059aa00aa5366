-- The bytes of the parameters a rank's optimizer updates, from the recorded shapes: the first input of the parameter
-- update in the rank's first optimizer step (aten::addcdiv_, _foreach_addcdiv_, _fused_adam_, _fused_adamw_: Adam,
-- AdamW, RMSprop, Adagrad; innermost, so a DTensor's local shard and not its global shape), else the input of every
-- torch::autograd::AccumulateGrad in the rank's first step that has one (full-size gradients: an over-estimate under
-- FSDP; a pipeline stage's received activation, a leaf, counts too); element size from Input type. One rule for the
-- memory attribution (_memory_blocks: P) and the re-layout (replay/structure.py), through parameter_bytes.
-- Spliced where a .sql file says `-- @include _parameter_bytes`, inside a WITH list; needs the _tensor_args macros
-- and $rank (NULL: every rank). Defines _param_bytes (rank, parameter_bytes, parameter_bytes_source).
_param_update_ops AS (
  SELECT e.rank, e.ts_ns, e.tid, e.name, e.input_dims, e.input_types,
         lead(e.ts_ns) OVER (PARTITION BY e.rank, e.tid ORDER BY e.ts_ns) AS next_ts_ns, e.ts_ns + e.dur_ns AS end_ns
  FROM events e
  WHERE e.ph = 'X' AND e.cat = 'cpu_op' AND e.name IN ('aten::addcdiv_', 'aten::_foreach_addcdiv_', 'aten::_fused_adam_',
                                                      'aten::_fused_adamw_')
    AND ($rank IS NULL OR e.rank = $rank)
),
_param_optimizer_steps AS (
  SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns, name,
         row_number() OVER (PARTITION BY rank ORDER BY ts_ns) AS n
  FROM events
  WHERE ph = 'X' AND cat = 'user_annotation' AND starts_with(name, 'Optimizer.step#') AND ($rank IS NULL OR rank = $rank)
),
_param_from_optimizer AS (
  SELECT s.rank,
         sum(_tensor_arg_nelems(u.input_dims, 0) * _tensor_dtype_bytes(_tensor_first_type(u.input_types)))::BIGINT
           AS parameter_bytes
  FROM _param_optimizer_steps s
  JOIN _param_update_ops u ON u.rank = s.rank AND u.ts_ns >= s.ts_ns AND u.ts_ns < s.end_ns
  WHERE s.n = 1 AND NOT coalesce(u.next_ts_ns < u.end_ns, false)  -- innermost: no later update inside it
  GROUP BY s.rank
),
_param_from_grads AS (
  SELECT rank, arg_min(bytes, step) AS parameter_bytes
  FROM (SELECT rank, step, sum(_tensor_arg_nelems(input_dims, 0)
                               * _tensor_dtype_bytes(_tensor_first_type(input_types)))::BIGINT AS bytes
        FROM cpu_ops
        WHERE name = 'torch::autograd::AccumulateGrad' AND step IS NOT NULL AND ($rank IS NULL OR rank = $rank)
        GROUP BY rank, step)
  WHERE bytes > 0
  GROUP BY rank
),
_param_bytes AS (
  SELECT rank, nullif(coalesce(o.parameter_bytes, g.parameter_bytes), 0) AS parameter_bytes,
         CASE WHEN o.parameter_bytes > 0 THEN 'optimizer' WHEN g.parameter_bytes > 0 THEN 'accumulate_grad'
         END AS parameter_bytes_source
  FROM _param_from_optimizer o FULL JOIN _param_from_grads g USING (rank)
),
