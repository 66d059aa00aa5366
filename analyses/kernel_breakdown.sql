-- GPU kernel breakdown: time per kernel name (top-k per class, the rest as "others") or per class.
--
-- Statistics are over every GPU op (kernels, memcpys, memsets) in scope, grouped by rank, class and
-- name; within each class the top_k names by total time are kept and the rest pooled as "others"
-- (HolisticTraceAnalysis pools by a cumulative-time quantile as well; this keeps exactly top_k).
-- With by_class, one row per class (name = the class). Durations are summed, not merged: two
-- overlapping kernels count twice.
--
-- @column rank          global rank
-- @column kernel_class  communication | memory | compute | other (analyses/kernel_classes.py)
-- @column name          kernel name, "others" for the pooled tail, or the class (by_class)
-- @column kernel_count  GPU ops in the row
-- @column total_ns      sum of durations, ns
-- @column mean_ns       mean duration, ns
-- @column min_ns        shortest duration, ns
-- @column p50_ns        median duration, ns
-- @column p95_ns        95th percentile duration, ns
-- @column max_ns        longest duration, ns
-- @column class_pct     total_ns / total of the class on the rank, percent
-- @column rank_pct      total_ns / total of all GPU ops on the rank, percent
WITH _k AS (
  SELECT rank, kernel_class, CASE WHEN $by_class THEN kernel_class ELSE name END AS name, dur_ns
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE dur_ns IS NOT NULL
),
_ranked AS (
  SELECT rank, kernel_class, name,
         row_number() OVER (PARTITION BY rank, kernel_class ORDER BY sum(dur_ns) DESC, name) AS position
  FROM _k GROUP BY rank, kernel_class, name
),
_labelled AS (
  SELECT k.*, CASE WHEN r.position <= $top_k THEN k.name ELSE 'others' END AS label
  FROM _k k JOIN _ranked r USING (rank, kernel_class, name)
),
_rows AS (
  SELECT rank, kernel_class, label AS name, count(*) AS kernel_count, sum(dur_ns) AS total_ns,
         avg(dur_ns) AS mean_ns, min(dur_ns) AS min_ns, quantile_cont(dur_ns, 0.5) AS p50_ns,
         quantile_cont(dur_ns, 0.95) AS p95_ns, max(dur_ns) AS max_ns
  FROM _labelled GROUP BY rank, kernel_class, label
)
SELECT rank, kernel_class, name, kernel_count, total_ns::BIGINT AS total_ns, mean_ns, min_ns, p50_ns, p95_ns, max_ns,
       100.0 * total_ns / sum(total_ns) OVER (PARTITION BY rank, kernel_class) AS class_pct,
       100.0 * total_ns / sum(total_ns) OVER (PARTITION BY rank) AS rank_pct
FROM _rows
ORDER BY rank, kernel_class, name = 'others', total_ns DESC, name
