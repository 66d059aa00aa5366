-- Private (depgraph.rank_shapes, read by replay/fold.py): per track (CPU thread or GPU stream), a hash of the
-- events the graph is built from, in the order the graph lays them out, and its measured working time: one pass
-- over the store that plans which ranks fold together before any graph is built. Two ranks whose tracks (ordered
-- as analyses/depgraph/tracks.py orders them: CPU threads before GPU streams, by pid and tid) hash alike ran the
-- same operators in the same order; which collectives they joined is the caller's to add. The same pass gives the
-- working leaves of the given threads (the gloo callers', where their waits on a collective are found): the SQL
-- twin of tracks.working_spans' leaves (tests/test_fold_first.py checks them equal).
--
-- @column rank        global rank
-- @column pid         process id
-- @column tid         thread id (a GPU stream's)
-- @column is_gpu      a GPU stream
-- @column h           hash of the sum of the hashes of the track's events' (cat, name, place) in the graph's order
--                     (CPU: start, longest first, event_id, and whether a top-level operator is of no length; GPU:
--                     start, event_id)
-- @column work_ns     measured working time: the track's working leaves (the innermost CPU operators and runtime
--                     calls, tracks.working_spans') or its device ops, summed
-- @column first_ns    the earliest start of its events (the graph's origin is the earliest of every track's and
--                     every step's)
-- @column leaf_ts     a given thread's working leaves' starts (NULL: not a given thread)
-- @column leaf_end    their ends
WITH cpu AS (
-- @include _graph_cpu
), gpu AS (
-- @include _graph_gpu
), callers AS (
    SELECT unnest($t_rank::BIGINT[]) AS rank, unnest($t_pid::BIGINT[]) AS pid, unnest($t_tid::BIGINT[]) AS tid,
           true AS caller
), cpu_events AS (
    -- one sort per thread (the graph's order) gives each event its place, whether it is a working leaf (no user
    -- annotation, no wait call, and the next such starts at or after its end: tracks.working_spans' leaves) and
    -- whether it is a top-level operator of no length: such an event gets no piece of its thread (tracks._cut)
    -- while one of some length does, which, unlike the length of a nested one, changes the graph's shape
    SELECT rank, pid, tid, cat, name, ts_ns, dur_ns, working, caller,
           row_number() OVER w AS pos,
           coalesce(lead(CASE WHEN working THEN ts_ns END IGNORE NULLS) OVER w >= ts_ns + dur_ns, true) AS is_leaf,
           dur_ns = 0 AND NOT (is_device_runtime(cat) OR cat = 'user_annotation' OR name LIKE 'c10d::%')
               AND coalesce(max(ts_ns + dur_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) <= ts_ns,
                            true) AS lone_instant
    FROM (SELECT c.*, cat <> 'user_annotation' AND NOT list_contains($wait_calls::VARCHAR[], coalesce(name, ''))
                 AS working, coalesce(k.caller, false) AS caller
          FROM cpu c LEFT JOIN callers k USING (rank, pid, tid))
    WINDOW w AS (PARTITION BY rank, pid, tid ORDER BY ts_ns, ts_ns + dur_ns DESC, event_id)
), cpu_tracks AS (
    SELECT rank, pid, tid, false AS is_gpu, sum(hash(cat, name, lone_instant, pos)::HUGEINT) AS h, min(ts_ns) AS first_ns,
           sum(dur_ns) FILTER (WHERE working AND is_leaf) AS work_ns,
           list(ts_ns) FILTER (WHERE working AND is_leaf AND caller) AS leaf_ts,
           list(ts_ns + dur_ns) FILTER (WHERE working AND is_leaf AND caller) AS leaf_end
    FROM cpu_events GROUP BY rank, pid, tid
), gpu_tracks AS (
    SELECT rank, pid, tid, true AS is_gpu, sum(hash(name, pos)::HUGEINT) AS h, min(ts_ns) AS first_ns,
           sum(dur_ns) AS work_ns, NULL::BIGINT[] AS leaf_ts, NULL::BIGINT[] AS leaf_end
    FROM (SELECT rank, pid, tid, name, ts_ns, dur_ns,
                 row_number() OVER (PARTITION BY rank, pid, tid ORDER BY ts_ns, event_id) AS pos FROM gpu)
    GROUP BY rank, pid, tid
)
SELECT rank, pid, tid, is_gpu, hash(h) AS h, coalesce(work_ns, 0)::BIGINT AS work_ns, first_ns,
       CASE WHEN len(leaf_ts) > 0 THEN leaf_ts END AS leaf_ts, CASE WHEN len(leaf_ts) > 0 THEN leaf_end END AS leaf_end
FROM (SELECT * FROM cpu_tracks UNION ALL SELECT * FROM gpu_tracks) ORDER BY rank, is_gpu, pid, tid
