-- Memory copy summary by direction: copies, bytes, busy time and bandwidth.
--
-- @column rank           global rank
-- @column direction      HtoD | DtoH | DtoD | PtoP | HtoH | memset | other
-- @column copy_count     memcpy/memset ops
-- @column total_bytes    bytes moved (set) in all
-- @column total_ns       sum of durations, ns
-- @column mean_bw_gbps   total_bytes / total_ns, GB/s
-- @column max_bw_gbps    fastest single copy, GB/s
WITH _c AS (
  SELECT rank, CASE WHEN kind = 'memset' THEN 'memset'
                    ELSE coalesce(nullif(regexp_extract(name, 'Memcpy (\w+)', 1), ''), 'other') END AS direction,
         dur_ns, bytes, coalesce(bytes / nullif(dur_ns, 0), memory_bw_gbps) AS bw_gbps
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE kind IN ('memcpy', 'memset') AND dur_ns IS NOT NULL
)
SELECT rank, direction, count(*) AS copy_count, sum(bytes)::BIGINT AS total_bytes, sum(dur_ns)::BIGINT AS total_ns,
       sum(bytes) / nullif(sum(dur_ns) FILTER (WHERE bytes IS NOT NULL), 0) AS mean_bw_gbps, max(bw_gbps) AS max_bw_gbps
FROM _c GROUP BY rank, direction ORDER BY rank, total_ns DESC
