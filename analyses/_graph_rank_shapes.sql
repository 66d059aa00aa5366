-- Private (depgraph.rank_shapes, read by replay/fold.py): per rank, a hash of the events its graph is built
-- from, in the order the graph lays them out, and its measured working time: one pass over the store that plans
-- which ranks fold together before any graph is built. Two ranks with the same shape ran the same operators
-- in the same order on the same threads and streams (tracks ordered as analyses/depgraph/tracks.py orders
-- them: CPU threads before GPU streams, by pid and tid); which collectives they joined is the caller's to add.
--
-- @column rank        global rank
-- @column shape       hash of the rank's tracks in order, each the sum of the hashes of its events' (cat, name,
--                     place) in the graph's order (CPU: start, longest first, event_id, and whether a top-level
--                     operator is of no length; GPU: start, event_id)
-- @column work_ns     measured working time: the rank's working leaves (the innermost CPU operators and runtime
--                     calls, tracks.working_spans') and its device ops, summed
-- @column first_ns    the earliest start of its CPU events and device ops (the graph's origin is the earliest of
--                     every rank's and every step's)
WITH cpu AS (
-- @include _graph_cpu
), gpu AS (
-- @include _graph_gpu
), cpu_events AS (
    -- one sort per thread (the graph's order) gives each event its place, whether it is a working leaf (no user
    -- annotation, no wait call, and the next such starts at or after its end: tracks.working_spans' leaves, as
    -- _graph_working.sql finds them) and whether it is a top-level operator of no length: such an event gets no
    -- piece of its thread (tracks._cut) while one of some length does, which, unlike the length of a nested one,
    -- changes the graph's shape
    SELECT rank, pid, tid, cat, name, ts_ns, dur_ns, working,
           row_number() OVER w AS pos,
           coalesce(lead(CASE WHEN working THEN ts_ns END IGNORE NULLS) OVER w >= ts_ns + dur_ns, true) AS is_leaf,
           dur_ns = 0 AND NOT (is_device_runtime(cat) OR cat = 'user_annotation' OR name LIKE 'c10d::%')
               AND coalesce(max(ts_ns + dur_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) <= ts_ns,
                            true) AS lone_instant
    FROM (SELECT *, cat <> 'user_annotation' AND NOT list_contains($wait_calls::VARCHAR[], coalesce(name, '')) AS working
          FROM cpu)
    WINDOW w AS (PARTITION BY rank, pid, tid ORDER BY ts_ns, ts_ns + dur_ns DESC, event_id)
), cpu_tracks AS (
    SELECT rank, pid, tid, false AS is_gpu, sum(hash(cat, name, lone_instant, pos)::HUGEINT) AS h, min(ts_ns) AS first_ns,
           sum(dur_ns) FILTER (WHERE working AND is_leaf) AS work_ns
    FROM cpu_events GROUP BY rank, pid, tid
), gpu_tracks AS (
    SELECT rank, pid, tid, true AS is_gpu, sum(hash(name, pos)::HUGEINT) AS h, min(ts_ns) AS first_ns,
           sum(dur_ns) AS work_ns
    FROM (SELECT rank, pid, tid, name, ts_ns, dur_ns,
                 row_number() OVER (PARTITION BY rank, pid, tid ORDER BY ts_ns, event_id) AS pos FROM gpu)
    GROUP BY rank, pid, tid
)
SELECT rank, hash(list(h ORDER BY is_gpu, pid, tid)) AS shape, coalesce(sum(work_ns), 0)::BIGINT AS work_ns,
       min(first_ns) AS first_ns
FROM (SELECT * FROM cpu_tracks UNION ALL SELECT * FROM gpu_tracks) GROUP BY rank ORDER BY rank
