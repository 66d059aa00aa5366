-- Shared private helpers for the analyses, installed as TEMP macros on the
-- connection before each analysis runs (analyses/_sql.py `prepare`). They need
-- the TEMP table _kernel_rules(priority, kernel_class, pattern) that `prepare`
-- writes from analyses/kernel_classes.py, so the classification lives in one place.

-- _kernel_class_of_name: one row per distinct GPU op name with the class of the
-- first rule (lowest priority) whose pattern matches it; names no rule matches
-- are absent (compute).
CREATE OR REPLACE TEMP VIEW _kernel_class_of_name AS
SELECT n.name, arg_min(r.kernel_class, r.priority) AS kernel_class, min(r.priority) AS rule_index
FROM (SELECT DISTINCT name FROM events WHERE ph = 'X' AND is_device_op(cat)) n
JOIN _kernel_rules r ON regexp_matches(n.name, r.pattern)
GROUP BY n.name;

-- _gpu_ops_classified: gpu_ops with kernel_class, materialised once per connection and rule set
-- (the view joins launches to ops and classifying runs regexes: ~0.1 s on 20k ops, paid once).
-- The store's views are bound to the files present at connect time, so this copy cannot go stale
-- while the connection lives. `prepare` runs this statement only when the store has no copy of it for
-- these rules (Store.cache_file), and keeps what it computed there; else it reads the copy.
CREATE OR REPLACE TEMP TABLE _gpu_ops_classified AS
SELECT g.rank, g.event_id, g.cat, g.name, g.pid, g.tid, g.ts_ns, g.dur_ns, g.end_ns, g.correlation, g.external_id,
       g.device, g.stream, g.bytes, g.memory_bw_gbps, g.kind, g.launch_ts_ns, g.launch_dur_ns, g.launch_name,
       g.launch_tid, g.step,
       CASE WHEN g.kind <> 'kernel' THEN 'memory' ELSE coalesce(c.kernel_class, 'compute') END AS kernel_class
FROM gpu_ops g LEFT JOIN _kernel_class_of_name c ON c.name = g.name;

-- _gpu_ops_in_scope(p_rank, p_step, p_drop_last): gpu_ops (kernels, memcpys,
-- memsets) of one rank / one step (NULL = all), with kernel_class. With
-- p_drop_last, keep only ops launched before the last ProfilerStep began on
-- ranks with at least two steps: HolisticTraceAnalysis's default scope (it
-- drops the last, often truncated, step and every op without a launch).
CREATE OR REPLACE TEMP MACRO _gpu_ops_in_scope(p_rank, p_step, p_drop_last) AS TABLE
WITH _last AS (SELECT rank, max(ts_ns) AS last_step_ts_ns, count(*) AS n_steps FROM steps GROUP BY rank)
SELECT g.*
FROM _gpu_ops_classified g
LEFT JOIN _last l ON l.rank = g.rank
WHERE (p_rank IS NULL OR g.rank = p_rank)
  AND (p_step IS NULL OR g.step = p_step)
  AND (NOT p_drop_last OR coalesce(l.n_steps, 0) < 2 OR g.launch_ts_ns < l.last_step_ts_ns);

-- _cpu_work_in_scope(p_rank, p_step, p_by_step): CPU operators and user annotations (not
-- the ProfilerStep annotations themselves) with their step and a class:
-- communication by _cpu_op_is_comm, compute otherwise.
-- The CPU-side stand-in for GPU kernels on traces without GPU activity.
-- _cpu_op_is_comm(name): a CPU operator or annotation of communication: c10d calls, functional collectives
-- (and their wait_tensor, where a thread blocks on one), gloo / nccl annotations, record_param_comms.
CREATE OR REPLACE TEMP MACRO _cpu_op_is_comm(n) AS (
  regexp_matches(n, '^(c10d::|_?c10d_functional::|gloo:|nccl:|record_param_comms|ProcessGroup)')
);

-- p_by_step: whether the caller reads `step` (else NULL, and the steps are not joined: at 4,096 ranks the join
-- was a third of a temporal breakdown). The events' own table, not the events view: no sparse args are needed.
-- Without steps the ASOF join is not planned at all (a branch each): with no step to join it still sorted every
-- op, 0.15 s of a 3.5 M-op chunk.
CREATE OR REPLACE TEMP MACRO _cpu_work_in_scope(p_rank, p_step, p_by_step) AS TABLE
WITH e AS (
  SELECT rank, tid, name, cat, ts_ns, dur_ns, ts_ns + dur_ns AS end_ns,
         CASE WHEN _cpu_op_is_comm(name) THEN 'communication' ELSE 'compute' END AS kernel_class
  FROM _events
  WHERE ph = 'X' AND cat IN ('cpu_op', 'user_annotation') AND dur_ns > 0 AND NOT starts_with(name, 'ProfilerStep#')
    AND (p_rank IS NULL OR rank = p_rank)
)
SELECT * FROM (
  SELECT e.rank, CASE WHEN e.ts_ns < s.end_ns THEN s.step END AS step, e.tid, e.name, e.cat, e.ts_ns, e.dur_ns,
         e.end_ns, e.kernel_class
  FROM e ASOF LEFT JOIN steps s ON e.rank = s.rank AND e.ts_ns >= s.ts_ns
  WHERE p_by_step OR p_step IS NOT NULL
  UNION ALL
  SELECT rank, NULL::BIGINT, tid, name, cat, ts_ns, dur_ns, end_ns, kernel_class FROM e
  WHERE NOT (p_by_step OR p_step IS NOT NULL)
)
WHERE (p_step IS NULL OR step = p_step);
