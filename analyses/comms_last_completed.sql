-- Flight-recorder progress per rank and process group: the last collective each rank enqueued, started and
-- completed. In a hang, the rank whose last completed collective is behind the others is where to look.
--
-- NCCL records states (scheduled, started, completed); gloo leaves entries 'scheduled', so its completed
-- figure comes from the dump's pg_status.
--
-- @column pg_name              process group name
-- @column rank                 global rank (from the dump's file name)
-- @column entries              entries in the rank's ring buffer for the group
-- @column first_seq            oldest collective sequence number still in the buffer
-- @column last_enqueued_seq    newest collective enqueued
-- @column last_started_seq     newest collective seen started (NULL: unknown)
-- @column last_completed_seq   newest collective seen completed (NULL: unknown)
-- @column last_completed_op    profiling name of that collective
-- @column behind_by            how many collectives this rank's last completed is behind the group's furthest rank
WITH e AS (
  SELECT * FROM fr_entries WHERE NOT coalesce(is_p2p, false) AND collective_seq_id IS NOT NULL AND collective_seq_id > 0
),
per AS (
  SELECT pg_name, rank, count(*) AS entries, min(collective_seq_id) AS first_seq,
         greatest(max(collective_seq_id), max(pg_last_enqueued_seq)) AS last_enqueued_seq,
         coalesce(max(collective_seq_id) FILTER (WHERE state IN ('started', 'completed')),
                  nullif(max(pg_last_started_seq), -1)) AS last_started_seq,
         coalesce(max(collective_seq_id) FILTER (WHERE state = 'completed'),
                  nullif(max(pg_last_completed_seq), -1)) AS last_completed_seq
  FROM e GROUP BY ALL
)
SELECT p.pg_name, p.rank, p.entries, p.first_seq, p.last_enqueued_seq, p.last_started_seq, p.last_completed_seq,
       (SELECT any_value(x.profiling_name) FROM e x WHERE x.pg_name = p.pg_name AND x.rank = p.rank
          AND x.collective_seq_id = p.last_completed_seq) AS last_completed_op,
       max(p.last_completed_seq) OVER (PARTITION BY p.pg_name) - p.last_completed_seq AS behind_by
FROM per p
ORDER BY p.pg_name, p.rank
