-- Private (depgraph): the innermost CPU operators and runtime calls of the given threads, those with nothing
-- nested inside (the next event on the thread, by start and longest first, starts at or after their end), no
-- user annotation and no wait call: the leaves tracks.working_spans unions into a thread's working spans (its
-- SQL twin for the threads of ranks whose graph is not built: tests/test_fold_first.py checks them equal).
--
-- @column rank        global rank
-- @column pid         process id
-- @column tid         thread id
-- @column ts_ns       start, ns
-- @column end_ns      end, ns
WITH cpu AS (
-- @include _graph_cpu
), threads AS (
    SELECT unnest($t_rank::BIGINT[]) AS rank, unnest($t_pid::BIGINT[]) AS pid, unnest($t_tid::BIGINT[]) AS tid
)
SELECT rank, pid, tid, ts_ns, end_ns FROM (
    SELECT c.rank, c.pid, c.tid, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns,
           lead(c.ts_ns) OVER (PARTITION BY c.rank, c.pid, c.tid ORDER BY c.ts_ns, c.ts_ns + c.dur_ns DESC) AS next_ts
    FROM cpu c SEMI JOIN threads t ON c.rank = t.rank AND c.pid = t.pid AND c.tid = t.tid
    WHERE c.cat <> 'user_annotation' AND NOT list_contains($wait_calls::VARCHAR[], coalesce(c.name, '')))
WHERE next_ts IS NULL OR next_ts >= end_ns
ORDER BY rank, pid, tid, ts_ns, end_ns DESC
