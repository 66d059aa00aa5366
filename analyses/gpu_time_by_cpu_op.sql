-- GPU time by CPU operator: each GPU op charged to the operator that launched it.
--
-- innermost: the cpu_op that shares the launch's External id (the aten op that called the launch);
-- top: the outermost cpu_op on the launching thread that contains the launch call (e.g. the module's
-- forward or aten::linear rather than aten::addmm). Ops whose launch no op encloses are "(no op)".
--
-- @column rank          global rank
-- @column level         innermost | top
-- @column op_name       CPU operator name, or (no op)
-- @column op_count      distinct operator instances that launched GPU work
-- @column kernel_count  GPU ops charged
-- @column gpu_time_ns   sum of their durations, ns
-- @column gpu_pct       gpu_time_ns / all GPU op time on the rank, percent
WITH _ops AS (
  SELECT rank, external_id, launch_ts_ns, launch_tid, dur_ns
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step) WHERE dur_ns IS NOT NULL
),
_cpu AS (
  SELECT rank, tid, event_id, name, ts_ns, end_ns, external_id FROM events
  WHERE ph = 'X' AND cat = 'cpu_op' AND ($rank IS NULL OR rank = $rank)
),
_inner_op AS (SELECT rank, external_id, arg_max(event_id, ts_ns) AS event_id, arg_max(name, ts_ns) AS name
              FROM _cpu WHERE external_id IS NOT NULL GROUP BY rank, external_id),
-- top-level ops: not inside an earlier op on the same thread; they are disjoint, so an ASOF join finds
-- the one around a launch
-- @include _top_ops
_top AS (SELECT rank, tid, event_id, name, ts_ns, end_ns FROM _top_flag WHERE is_top),
_innermost AS (
  SELECT o.rank, 'innermost' AS level, i.name AS op_name, i.event_id AS op_event_id, o.dur_ns
  FROM _ops o LEFT JOIN _inner_op i ON i.rank = o.rank AND i.external_id = o.external_id
),
_outermost AS (
  SELECT o.rank, 'top' AS level, CASE WHEN o.launch_ts_ns < t.end_ns THEN t.name END AS op_name,
         CASE WHEN o.launch_ts_ns < t.end_ns THEN t.event_id END AS op_event_id, o.dur_ns
  FROM _ops o ASOF LEFT JOIN _top t ON t.rank = o.rank AND t.tid = o.launch_tid AND o.launch_ts_ns >= t.ts_ns
),
_all AS (SELECT * FROM _innermost WHERE $level IN ('innermost', 'both')
         UNION ALL SELECT * FROM _outermost WHERE $level IN ('top', 'both'))
SELECT rank, level, coalesce(op_name, '(no op)') AS op_name, count(DISTINCT op_event_id) AS op_count,
       count(*) AS kernel_count, sum(dur_ns)::BIGINT AS gpu_time_ns,
       100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY rank, level) AS gpu_pct
FROM _all GROUP BY 1, 2, 3 ORDER BY rank, level, gpu_time_ns DESC, op_name
