-- Private: count and total time per (kind, name) of one run, the input of trace_diff.
SELECT 'gpu_op' AS kind, name, count(*) AS n, sum(dur_ns)::BIGINT AS total_ns
FROM gpu_ops WHERE ($rank IS NULL OR rank = $rank) AND ($step IS NULL OR step = $step) GROUP BY name
UNION ALL
SELECT 'cpu_op', name, count(*), sum(dur_ns)::BIGINT
FROM cpu_ops WHERE ($rank IS NULL OR rank = $rank) AND ($step IS NULL OR step = $step) GROUP BY name
