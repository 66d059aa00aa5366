-- Memory copy bandwidth over time by direction (HtoD / DtoH / DtoD / PtoP / memset).
--
-- Each memcpy/memset moves bytes / dur_ns GB/s (bytes per ns) from its start to its end; the series
-- is the summed bandwidth of the copies in flight, one row per change. Copies without a byte count
-- use the trace's "memory bandwidth (GB/s)" arg.
--
-- @column rank       global rank
-- @column direction  HtoD | DtoH | DtoD | PtoP | HtoH | memset | other
-- @column ts_ns      time of the change, trace clock ns
-- @column bw_gbps    bandwidth of all copies of that direction in flight from ts_ns on, GB/s
-- @column in_flight  copies of that direction in flight from ts_ns on
WITH _c AS (
  SELECT rank, CASE WHEN kind = 'memset' THEN 'memset'
                    ELSE coalesce(nullif(regexp_extract(name, 'Memcpy (\w+)', 1), ''), 'other') END AS direction,
         ts_ns, end_ns, coalesce(bytes / nullif(dur_ns, 0), memory_bw_gbps, 0) AS bw_gbps
  FROM _gpu_ops_in_scope($rank, $step, $drop_last_step)
  WHERE kind IN ('memcpy', 'memset') AND dur_ns IS NOT NULL
),
_ev AS (
  SELECT rank, direction, ts_ns, bw_gbps AS d_bw, 1 AS d_n FROM _c
  UNION ALL
  SELECT rank, direction, end_ns, -bw_gbps, -1 FROM _c
),
_changes AS (SELECT rank, direction, ts_ns, sum(d_bw) AS d_bw, sum(d_n) AS d_n FROM _ev GROUP BY ALL)
SELECT rank, direction, ts_ns,
       greatest(sum(d_bw) OVER w, 0) AS bw_gbps,
       sum(d_n) OVER w AS in_flight
FROM _changes
WINDOW w AS (PARTITION BY rank, direction ORDER BY ts_ns ROWS UNBOUNDED PRECEDING)
ORDER BY rank, direction, ts_ns
