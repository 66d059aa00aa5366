-- GPU time by user annotation: each GPU op charged to the deepest gpu_user_annotation around it.
--
-- gpu_user_annotation events (record_function ranges mirrored on the GPU timeline) nest; an op is
-- charged to the innermost one on its rank and device that contains its start (the latest-starting
-- one, the shortest on ties). Ops outside every annotation are "(unannotated)".
--
-- @column rank          global rank
-- @column annotation    annotation name, or (unannotated)
-- @column op_count      GPU ops charged
-- @column gpu_time_ns   sum of their durations, ns
-- @column gpu_pct       gpu_time_ns / all GPU op time on the rank, percent
WITH _ops AS (
  SELECT rank, pid, event_id, ts_ns, dur_ns FROM _gpu_ops_in_scope($rank, $step, $drop_last_step) WHERE dur_ns IS NOT NULL
),
_ann AS (
  SELECT rank, pid, name, ts_ns, end_ns, dur_ns FROM events
  WHERE ph = 'X' AND cat = 'gpu_user_annotation' AND ($rank IS NULL OR rank = $rank)
),
_charged AS (
  SELECT o.rank, o.event_id, any_value(o.dur_ns) AS dur_ns,
         arg_max(a.name, (a.ts_ns, -a.dur_ns)) AS annotation
  FROM _ops o LEFT JOIN _ann a ON a.rank = o.rank AND a.pid = o.pid AND a.ts_ns <= o.ts_ns AND o.ts_ns < a.end_ns
  GROUP BY o.rank, o.event_id
)
SELECT rank, coalesce(annotation, '(unannotated)') AS annotation, count(*) AS op_count,
       sum(dur_ns)::BIGINT AS gpu_time_ns, 100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY rank) AS gpu_pct
FROM _charged GROUP BY 1, 2 ORDER BY rank, gpu_time_ns DESC
