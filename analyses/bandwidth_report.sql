-- Bandwidth report: bus bandwidth per source, process group, op and message-size bucket (powers of two), over
-- the matched collectives with a known size and a transfer time. busbw uses the nccl-tests factors, so figures
-- compare with an nccl-tests run on the same network: when the store holds one (`tracekit ingest
-- --nccl-tests FILE`), each collective's busbw is compared with the reference busbw at its size, interpolated
-- log-linearly between the two nearest reference sizes of the same op (clamped to the end points outside the
-- tested range). The reference is the out-of-place curve, the best figure when several files give a size.
--
-- @column source            kineto | nccl_inspector
-- @column pg_name           process group name (Inspector: the communicator hash; NULL when the trace does not say)
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
-- @column ref_busbw_gbps    median over the bucket's collectives of the reference busbw at their sizes (NULL: no reference for the op)
-- @column busbw_vs_ref_pct  median of each collective's busbw / its reference busbw, percent
-- @column below_ref_count   collectives under below_ref_pct percent of their reference busbw
-- @column ref_extrapolated  some collective's size lies outside the tested sizes (the nearest end point was used)
WITH m AS (
  SELECT source, pg_name, op, group_size, bytes, transfer_ns,
         bytes / transfer_ns AS algbw_gbps, bytes / transfer_ns * busbw_factor AS busbw_gbps,
         (2::BIGINT ** floor(log2(bytes))::BIGINT)::BIGINT AS size_bucket_bytes
  FROM _comm_matched
  -- an Inspector collective without timestamps still has its exec times, hence a transfer time
  WHERE bytes > 0 AND transfer_ns > 0 AND (n_timed >= 1 OR source = 'nccl_inspector')
    AND ($op IS NULL OR op = $op)
),
ref AS (
  SELECT op, size_bytes, max(busbw_gbps) AS busbw_gbps
  FROM nccl_tests WHERE NOT in_place AND busbw_gbps IS NOT NULL AND size_bytes > 0 GROUP BY op, size_bytes
),
with_ref AS (
  SELECT m.*,
         (SELECT arg_max(struct_pack(s := r.size_bytes, b := r.busbw_gbps), r.size_bytes) FROM ref r
          WHERE r.op = m.op AND r.size_bytes <= m.bytes) AS lo,
         (SELECT arg_min(struct_pack(s := r.size_bytes, b := r.busbw_gbps), r.size_bytes) FROM ref r
          WHERE r.op = m.op AND r.size_bytes >= m.bytes) AS hi
  FROM m
),
interp AS (
  SELECT *,
         CASE WHEN lo IS NOT NULL AND hi IS NOT NULL AND hi.s > lo.s
                THEN lo.b + (hi.b - lo.b) * (ln(bytes) - ln(lo.s)) / (ln(hi.s) - ln(lo.s))
              ELSE coalesce(lo.b, hi.b) END AS ref_gbps,
         (lo IS NULL) <> (hi IS NULL) AS extrapolated
  FROM with_ref
),
b AS (SELECT *, median(busbw_gbps) OVER (PARTITION BY source, pg_name, op, size_bucket_bytes) AS bucket_median FROM interp)
SELECT source, pg_name, op, max(group_size) AS group_size, size_bucket_bytes, count(*) AS collectives,
       sum(bytes)::BIGINT AS bytes_total, sum(transfer_ns)::BIGINT AS transfer_ns,
       median(algbw_gbps) AS median_algbw_gbps, median(busbw_gbps) AS median_busbw_gbps,
       min(busbw_gbps) AS min_busbw_gbps, max(busbw_gbps) AS max_busbw_gbps,
       count(*) FILTER (WHERE busbw_gbps < 0.5 * bucket_median) AS slow_count,
       median(ref_gbps) AS ref_busbw_gbps,
       median(100.0 * busbw_gbps / ref_gbps) AS busbw_vs_ref_pct,
       count(*) FILTER (WHERE 100.0 * busbw_gbps / ref_gbps < $below_ref_pct) AS below_ref_count,
       coalesce(bool_or(extrapolated), false) AS ref_extrapolated
FROM b
GROUP BY source, pg_name, op, size_bucket_bytes
ORDER BY source, pg_name NULLS FIRST, op, size_bucket_bytes
