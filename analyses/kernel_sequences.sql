-- Frequent GPU kernel sequences under an operator: which runs of kernels repeat, and their cost.
--
-- Instances are the CPU operators named operator (or every top-level operator when operator is NULL);
-- the kernels an instance launched, in launch order, are cut into every run of `length` consecutive
-- kernels; runs are counted across instances. The top_k most frequent per rank (then by GPU time).
--
-- @column rank            global rank
-- @column operator        operator name
-- @column sequence        kernel names joined by " -> "
-- @column length          kernels in the sequence
-- @column occurrences     times the sequence occurs
-- @column instance_count  operator instances it occurs in
-- @column gpu_time_ns     summed durations of the kernels of every occurrence, ns
WITH _cpu AS (
  SELECT rank, tid, event_id, name, ts_ns, end_ns FROM events
  WHERE ph = 'X' AND cat = 'cpu_op' AND ($rank IS NULL OR rank = $rank)
),
-- @include _top_ops
_inst AS (SELECT rank, tid, event_id, name, ts_ns, end_ns FROM _top_flag
          WHERE CASE WHEN $operator IS NULL THEN is_top ELSE name = $operator END),
_k AS (
  SELECT o.rank, i.event_id AS instance_id, i.name AS operator, o.name, o.dur_ns, o.launch_ts_ns, o.correlation
  FROM (SELECT * FROM _gpu_ops_in_scope($rank, $step, false) WHERE kind = 'kernel' AND launch_ts_ns IS NOT NULL) o
  ASOF JOIN _inst i ON i.rank = o.rank AND i.tid = o.launch_tid AND o.launch_ts_ns >= i.ts_ns
  WHERE o.launch_ts_ns < i.end_ns
),
_w AS (
  SELECT rank, operator, instance_id,
         list(name) OVER w AS names, sum(dur_ns) OVER w AS gpu_ns, count(*) OVER w AS n
  FROM _k
  WINDOW w AS (PARTITION BY rank, instance_id ORDER BY launch_ts_ns, correlation
               ROWS BETWEEN CURRENT ROW AND $length - 1 FOLLOWING)
),
_seq AS (
  SELECT rank, operator, array_to_string(names, ' -> ') AS sequence, count(*) AS occurrences,
         count(DISTINCT instance_id) AS instance_count, sum(gpu_ns)::BIGINT AS gpu_time_ns
  FROM _w WHERE n = $length GROUP BY rank, operator, names
)
SELECT rank, operator, sequence, $length AS length, occurrences, instance_count, gpu_time_ns
FROM _seq
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY occurrences DESC, gpu_time_ns DESC, sequence) <= $top_k
ORDER BY rank, occurrences DESC, gpu_time_ns DESC, sequence
