-- Flight-recorder check: per process group and collective sequence number, collectives not joined by every
-- rank and op / size / dtype / state mismatches between ranks (the questions PyTorch's flight-recorder
-- analyzer answers). One row per problem; no rows when the dumps agree.
--
-- A rank counts as missing from collective N of a group when its dump holds that group and its ring buffer
-- reaches back to N (its oldest entry is not newer) but has no entry N. A mismatch names the ranks whose value
-- differs from the most common one.
--
-- @column pg_name            process group name
-- @column pg_desc            process group description
-- @column collective_seq_id  the collective's sequence number in its group
-- @column op                 profiling name most ranks give it (nccl:all_reduce, gloo:broadcast, ...)
-- @column issue              missing_ranks | op_mismatch | size_mismatch | dtype_mismatch | state_mismatch
-- @column ranks_present      ranks whose dump holds the collective
-- @column suspect_ranks      the missing ranks, or the ranks that disagree with the majority
-- @column expected           the majority value (for mismatches)
-- @column values             every value seen (for mismatches)
WITH e AS (
  SELECT rank, pg_name, pg_desc, collective_seq_id AS seq, profiling_name, input_sizes, input_dtypes, state
  FROM fr_entries WHERE NOT coalesce(is_p2p, false) AND collective_seq_id IS NOT NULL AND collective_seq_id > 0
),
dumped AS (SELECT pg_name, rank, min(seq) AS min_seq FROM e GROUP BY ALL),
coll AS (
  SELECT pg_name, seq, any_value(pg_desc) AS pg_desc, mode(profiling_name) AS op, list(DISTINCT rank ORDER BY rank) AS ranks_present
  FROM e GROUP BY ALL
),
missing AS (
  SELECT c.pg_name, c.seq, list(d.rank ORDER BY d.rank) AS suspects
  FROM coll c JOIN dumped d ON d.pg_name = c.pg_name AND d.min_seq <= c.seq
  WHERE NOT list_contains(c.ranks_present, d.rank)
  GROUP BY ALL
),
aspects AS (
  SELECT pg_name, seq, rank, 'op_mismatch' AS issue, profiling_name AS v FROM e
  UNION ALL SELECT pg_name, seq, rank, 'size_mismatch', input_sizes FROM e
  UNION ALL SELECT pg_name, seq, rank, 'dtype_mismatch', input_dtypes FROM e
  UNION ALL SELECT pg_name, seq, rank, 'state_mismatch', state FROM e
),
majority AS (
  SELECT pg_name, seq, issue, mode(v) AS expected, list(DISTINCT v ORDER BY v) AS vals
  FROM aspects GROUP BY ALL HAVING count(DISTINCT v) > 1
),
odd AS (
  SELECT a.pg_name, a.seq, a.issue, m.expected, m.vals, list(a.rank ORDER BY a.rank) AS suspects
  FROM aspects a JOIN majority m USING (pg_name, seq, issue)
  WHERE a.v IS DISTINCT FROM m.expected
  GROUP BY ALL
),
problems AS (
  SELECT pg_name, seq, 'missing_ranks' AS issue, suspects, NULL AS expected, NULL::VARCHAR[] AS vals FROM missing
  UNION ALL SELECT pg_name, seq, issue, suspects, expected, vals FROM odd
)
SELECT p.pg_name, c.pg_desc, p.seq AS collective_seq_id, c.op, p.issue, c.ranks_present, p.suspects AS suspect_ranks,
       p.expected, p.vals AS "values"
FROM problems p JOIN coll c USING (pg_name, seq)
ORDER BY p.pg_name, p.seq, p.issue
