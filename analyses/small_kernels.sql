-- Short kernels per rank: the rank's kernels shorter than max_ns (default 10 us: launch-bound on every
-- current GPU, the launch costs about what the work does) and the time they take.
--
-- @column rank             global rank
-- @column kernels          kernels on the rank
-- @column kernel_ns        their summed duration, ns
-- @column small_kernels    kernels shorter than max_ns
-- @column small_kernel_ns  their summed duration, ns
-- @column small_pct        small_kernels / kernels, percent
SELECT rank, count(*) AS kernels, sum(dur_ns)::BIGINT AS kernel_ns,
       count(*) FILTER (WHERE dur_ns < $max_ns) AS small_kernels,
       coalesce(sum(dur_ns) FILTER (WHERE dur_ns < $max_ns), 0)::BIGINT AS small_kernel_ns,
       100.0::DOUBLE * count(*) FILTER (WHERE dur_ns < $max_ns) / count(*) AS small_pct
FROM kernels
WHERE $rank IS NULL OR rank = $rank
GROUP BY rank
ORDER BY rank
