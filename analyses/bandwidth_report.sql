-- Bandwidth report: bus bandwidth per process group, op and message-size bucket (powers of two), over the
-- matched collectives with a known size and a transfer time. busbw uses the nccl-tests factors, so figures
-- compare with an nccl-tests run on the same network.
--
-- @column pg_name           process group name (NULL when the trace does not say)
-- @column op                collective op
-- @column group_size        ranks in the group
-- @column size_bucket_bytes lower bound of the size bucket (a power of two)
-- @column collectives       matched collectives in the bucket
-- @column bytes_total       bytes moved (sum of collective sizes)
-- @column transfer_ns       sum of transfer times
-- @column median_algbw_gbps median algbw, GB/s
-- @column median_busbw_gbps median busbw, GB/s
-- @column min_busbw_gbps    slowest collective's busbw
-- @column max_busbw_gbps    fastest collective's busbw
-- @column slow_count        collectives under half the bucket's median busbw
WITH m AS (
  SELECT pg_name, op, group_size, bytes, transfer_ns,
         bytes / transfer_ns AS algbw_gbps, bytes / transfer_ns * busbw_factor AS busbw_gbps,
         (2::BIGINT ** floor(log2(bytes))::BIGINT)::BIGINT AS size_bucket_bytes
  FROM _comm_matched
  WHERE bytes > 0 AND transfer_ns > 0 AND len(timed_ranks) >= 1 AND ($op IS NULL OR op = $op)
),
b AS (SELECT *, median(busbw_gbps) OVER (PARTITION BY pg_name, op, size_bucket_bytes) AS bucket_median FROM m)
SELECT pg_name, op, max(group_size) AS group_size, size_bucket_bytes, count(*) AS collectives,
       sum(bytes)::BIGINT AS bytes_total, sum(transfer_ns)::BIGINT AS transfer_ns,
       median(algbw_gbps) AS median_algbw_gbps, median(busbw_gbps) AS median_busbw_gbps,
       min(busbw_gbps) AS min_busbw_gbps, max(busbw_gbps) AS max_busbw_gbps,
       count(*) FILTER (WHERE busbw_gbps < 0.5 * bucket_median) AS slow_count
FROM b
GROUP BY pg_name, op, size_bucket_bytes
ORDER BY pg_name NULLS FIRST, op, size_bucket_bytes
