-- Gradient collectives against the backward, per rank and step: whether the step's gradient all-reduce /
-- reduce-scatter calls (c10d::*allreduce*, c10d::*reduce_scatter*) were issued while the backward still
-- computed, or only once it had computed every gradient. The backward is the autograd operators
-- (autograd::engine::evaluate_function:*); its compute ends with the last of them that issued no
-- collective on its thread. A step without such calls, without autograd operators, or without a gradient
-- call after the backward began has no row. The rank's last step is left out.
--
-- @column rank                  global rank
-- @column step                  ProfilerStep#N
-- @column gradient_calls        gradient all-reduce / reduce-scatter calls issued from the backward's start on
-- @column calls_after_backward  of those, the calls issued after the backward's compute ended
-- @column backward_ns           from the first autograd operator's start to the end of the backward's compute, ns
-- @column gap_ns                first gradient call's start less the end of the backward's compute, ns
--                               (negative: a call went while the backward computed)
WITH _steps_in AS (SELECT rank, step FROM steps WHERE NOT is_last AND ($rank IS NULL OR rank = $rank)),
_ops AS (
  SELECT o.rank, o.step, o.tid, o.ts_ns, o.ts_ns + o.dur_ns AS end_ns, o.name LIKE 'c10d::%' AS is_call
  FROM cpu_ops o SEMI JOIN _steps_in USING (rank, step)
  WHERE o.dur_ns > 0 AND (o.name LIKE 'autograd::engine::evaluate_function:%'
        OR (o.name LIKE 'c10d::%' AND (o.name LIKE '%allreduce%' OR o.name LIKE '%reduce_scatter%')))
),
_calls AS (SELECT rank, step, tid, ts_ns FROM _ops WHERE is_call),
_fns AS (SELECT rank, step, tid, ts_ns, end_ns FROM _ops WHERE NOT is_call),
_own AS (  -- autograd operators that issued no collective on their thread: the backward's compute
  SELECT f.* FROM _fns f
  WHERE NOT EXISTS (SELECT 1 FROM _calls c WHERE c.rank = f.rank AND c.step = f.step AND c.tid = f.tid
                                             AND c.ts_ns >= f.ts_ns AND c.ts_ns < f.end_ns)
),
_backward AS (
  SELECT b.rank, b.step, b.start_ns, e.end_ns
  FROM (SELECT rank, step, min(ts_ns) AS start_ns FROM _fns GROUP BY rank, step) b
  JOIN (SELECT rank, step, max(end_ns) AS end_ns FROM _own GROUP BY rank, step) e USING (rank, step)
),
_per_step AS (
  SELECT b.rank, b.step, count(*) AS gradient_calls,
         count(*) FILTER (WHERE c.ts_ns >= b.end_ns) AS calls_after_backward,
         any_value(b.end_ns - b.start_ns) AS backward_ns, min(c.ts_ns) - any_value(b.end_ns) AS gap_ns
  FROM _backward b JOIN _calls c ON c.rank = b.rank AND c.step = b.step AND c.ts_ns >= b.start_ns
  GROUP BY b.rank, b.step
)
SELECT rank, step, gradient_calls, calls_after_backward, backward_ns, gap_ns FROM _per_step ORDER BY rank, step
