-- Clock offsets per rank, estimated from matched collectives: a collective's participants finish at nearly
-- the same moment (the last data arrives everywhere together), so each rank's median deviation from the
-- collective's median end is its clock's offset. Reported relative to the lowest rank; an explicit
-- correction (analyses' aligned=True, `tracekit comms align`), never applied silently.
--
-- Uses every collective with two or more timed participants (overlap is not required: clock error is what
-- makes them look disjoint). Gloo (CPU) ends are less simultaneous than NCCL kernel ends; residual_ns says
-- how well the offsets explain the ends.
--
-- @column rank              global rank
-- @column clock_offset_ns   correction to add to this rank's times (0 for the reference rank)
-- @column collectives       matched collectives used
-- @column residual_ns       median |end deviation| left after the correction
-- @column reference_rank    the rank whose clock the others are aligned to
WITH c AS (
  SELECT r.rank, r.match_key, r.end_ns - r.clock_offset_ns AS end_ns
  FROM _comm_rows r JOIN _comm_matched m USING (match_key)
  WHERE r.end_ns IS NOT NULL AND m.n_timed >= 2
),
-- relative to the collective's first end first: epoch ns do not fit a DOUBLE exactly, and median() is DOUBLE
rel AS (SELECT rank, match_key, end_ns - min(end_ns) OVER (PARTITION BY match_key) AS rel_ns FROM c),
d AS (SELECT rank, match_key, rel_ns - median(rel_ns) OVER (PARTITION BY match_key) AS dev_ns FROM rel),
per AS (SELECT rank, -median(dev_ns) AS raw_offset_ns, count(*) AS collectives FROM d GROUP BY rank),
ref AS (SELECT arg_min(raw_offset_ns, rank) AS ref_offset_ns, min(rank) AS reference_rank FROM per),
res AS (SELECT d.rank, median(abs(d.dev_ns + p.raw_offset_ns - med.m)) AS residual_ns
        FROM d JOIN per p USING (rank)
        JOIN (SELECT match_key, median(dd.dev_ns + pp.raw_offset_ns) AS m FROM d dd JOIN per pp USING (rank)
              GROUP BY match_key) med USING (match_key)
        GROUP BY d.rank)
SELECT p.rank, round(p.raw_offset_ns - ref.ref_offset_ns)::BIGINT AS clock_offset_ns, p.collectives,
       round(res.residual_ns)::BIGINT AS residual_ns, ref.reference_rank
FROM per p, ref JOIN res ON true
WHERE res.rank = p.rank
ORDER BY p.rank
