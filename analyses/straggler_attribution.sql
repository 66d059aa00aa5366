-- Straggler attribution: per rank (or per step and rank), how often it arrived last at collectives, by how
-- much, and how much waiting that caused the other participants. Most harmful first.
--
-- A rank's delay at a collective it arrived last at is the collective's arrival skew (how long after the
-- first participant it came: the time the earliest rank waited for it). The wait it caused is the sum of the
-- other participants' waits (their duration less the transfer time). Only collectives with two or more timed
-- participants count. A rank is consistently late when it is last at least twice and at twice its fair share
-- (2 / group size) of the collectives it joined.
--
-- @column step               ProfilerStep#N (by_step), NULL for the whole trace
-- @column rank               global rank
-- @column collectives        matched collectives the rank took part in (two or more timed participants)
-- @column late_count         of those, how many it arrived last at
-- @column late_share         late_count / collectives
-- @column avg_delay_ns       mean arrival skew of the collectives it arrived last at (NULL: never last)
-- @column max_delay_ns       largest of those
-- @column caused_wait_ns     sum of the other participants' waits at the collectives it arrived last at
-- @column wait_ns            the rank's own waiting at collectives
-- @column consistently_late  late at least twice and at twice its fair share
WITH p AS (
  SELECT r.rank, r.step, r.match_key, m.group_size, m.arrival_skew_ns, m.last_arrival_rank,
         greatest(r.end_ns - r.start_ns - m.transfer_ns - coalesce(r.queued_ns, 0), 0) AS wait_ns
  FROM _comm_rows r JOIN _comm_matched m USING (match_key)
  WHERE r.start_ns IS NOT NULL AND m.n_timed >= 2
),
per_coll AS (
  SELECT match_key, any_value(last_arrival_rank) AS late_rank,
         sum(wait_ns) FILTER (WHERE rank <> last_arrival_rank) AS others_wait_ns
  FROM p GROUP BY match_key
),
j AS (
  SELECT p.*, CASE WHEN $by_step THEN p.step END AS grp_step, p.rank = c.late_rank AS late,
         CASE WHEN p.rank = c.late_rank THEN coalesce(c.others_wait_ns, 0) ELSE 0 END AS caused_ns
  FROM p JOIN per_coll c USING (match_key)
)
SELECT grp_step AS step, rank, count(*) AS collectives, count(*) FILTER (WHERE late) AS late_count,
       count(*) FILTER (WHERE late) / count(*)::DOUBLE AS late_share,
       round_even(avg(arrival_skew_ns) FILTER (WHERE late), 0)::BIGINT AS avg_delay_ns,
       max(arrival_skew_ns) FILTER (WHERE late) AS max_delay_ns,
       sum(caused_ns)::BIGINT AS caused_wait_ns, sum(wait_ns)::BIGINT AS wait_ns,
       count(*) FILTER (WHERE late) >= 2
         AND count(*) FILTER (WHERE late) / count(*)::DOUBLE >= 2.0 / greatest(max(group_size), 2) AS consistently_late
FROM j
WHERE $rank IS NULL OR rank = $rank
GROUP BY grp_step, rank
ORDER BY grp_step NULLS FIRST, caused_wait_ns DESC, late_count DESC, rank
