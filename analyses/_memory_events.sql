-- Shared private fragment: the [memory] events in scope and the block each allocation makes, with the frees a CPU
-- trace lost put back, the one series and the one set of block ends every memory analysis reads (memory_timeline,
-- memory_peak, and memory_breakdown's blocks through _memory_blocks). Spliced by analyses/_sql.py where a .sql file
-- says `-- @include _memory_events`, at the head of a WITH list; needs $rank. Defines
--   _mem_block_ends  per allocation (Bytes > 0): its block (rank, device, pid, tid, alloc_event_id, alloc_ts_ns,
--                    bytes), the event that ends it (end_event_id, end_ts_ns, end_pid, end_tid; NULL: live at the
--                    trace's end) and whether the trace lost its free (lost)
--   _mem_events      the memory table's rows in scope, total_allocated less lost_free_bytes: the bytes of the blocks
--                    whose free was lost and that had ended by the event (0 on a CUDA device)
--
-- A block lives until the next event at its address: the free that ends it or, where the free was lost, the
-- allocation that reuses the address. PyTorch's CPU allocator reports a free to the profiler only from a thread the
-- profiler follows, and its Total Allocated comes down only there (c10::ProfiledCPUMemoryReporter): a block another
-- thread frees writes no event and stays counted. So on a CPU device:
--   - a block whose address is allocated again with no free between had ended by then;
--   - a block made inside a process group's collective call (c10d::*) whose free was lost (no later event at its
--     address, or an allocation there) was the backend's own buffer, released by its worker thread (gloo's
--     reduce-scatter runs an all-reduce of a clone of its input): it ends at the first event after the first
--     backend transfer (a gloo:* annotation) that began once the call had (the worker may start it after the call
--     returns) ended, or at the reuse if that came first. A functional collective's (_c10d_functional::*) output
--     is the caller's tensor: not so;
--   - so does a buffer made before the process group's call that moves it, inside the range that prepares it:
--     FSDP's all-gather buffer (inside `FSDP::all_gather`: FSDP2 allocates it, then copies the shards in) and a
--     functional collective's clone of its input (inside `_c10d_functional::*`). The functional one is its
--     caller's output: one never freed that was made in the trace's last step (or in a trace without steps) may
--     be held still and stays, unless the same call's output one step before (the same thread's block of that
--     place and size among the step's functional ones) was dropped or freed within its step; one whose address
--     came back, or that outlived a step with no free, was dropped by the backend's worker;
-- and from the event that ends it, a lost block's bytes are off the total. The CUDA caching allocator keeps its
-- totals on every thread: its events are kept as written, and a reuse only ends the block.
_mem_raw AS (SELECT * FROM memory WHERE ($rank IS NULL OR rank = $rank)),
_mem_seq AS (
  SELECT *, lead(event_id) OVER w AS next_event_id, lead(ts_ns) OVER w AS next_ts_ns, lead(pid) OVER w AS next_pid,
         lead(tid) OVER w AS next_tid, lead(bytes) OVER w AS next_bytes
  FROM _mem_raw
  WINDOW w AS (PARTITION BY rank, device_type, device_id, addr ORDER BY ts_ns, event_id)
),
_mem_orphans AS (  -- CPU blocks whose free the trace lost: no later event at the address, or an allocation next
  SELECT rank, device_type, device_id, pid, tid, event_id, ts_ns, next_event_id IS NOT NULL AS reused FROM _mem_seq
  WHERE device_type = 0 AND bytes > 0 AND (next_event_id IS NULL OR next_bytes > 0)
),
_mem_calls AS (
  SELECT rank, pid, tid, name, ts_ns, ts_ns + dur_ns AS end_ns FROM events
  WHERE ph = 'X' AND cat = 'cpu_op' AND dur_ns > 0 AND ($rank IS NULL OR rank = $rank)
    AND (starts_with(name, 'c10d::') OR starts_with(name, '_c10d_functional::'))
),
_mem_orphan_calls AS (
  SELECT o.rank, o.device_type, o.device_id, o.event_id, c.ts_ns AS call_ts_ns
  FROM _mem_orphans o
  JOIN _mem_calls c ON c.rank = o.rank AND c.pid = o.pid AND c.tid = o.tid AND starts_with(c.name, 'c10d::')
                    AND o.ts_ns >= c.ts_ns AND o.ts_ns < c.end_ns
  WHERE NOT EXISTS (SELECT 1 FROM _mem_calls f
                    WHERE f.rank = o.rank AND f.pid = o.pid AND f.tid = o.tid
                      AND starts_with(f.name, '_c10d_functional::') AND o.ts_ns >= f.ts_ns AND o.ts_ns < f.end_ns)
),
_mem_buffer_ranges AS (  -- where a collective's buffer is made before the process group's call that moves it
  SELECT rank, pid, tid, ts_ns, ts_ns + dur_ns AS end_ns, starts_with(name, '_c10d_functional::') AS functional
  FROM events
  WHERE ph = 'X' AND dur_ns > 0 AND ($rank IS NULL OR rank = $rank)
    AND (name = 'FSDP::all_gather' OR starts_with(name, 'FSDP::all_gather (')  -- FSDP's (not its copy-out's)
         OR (cat = 'cpu_op' AND starts_with(name, '_c10d_functional::')))
),
_mem_last_step AS (  -- the last step's start and the one before it (NULL: one step)
  SELECT rank, max(ts_ns) AS ts_ns, list(ts_ns ORDER BY ts_ns DESC)[2] AS prev_ts_ns
  FROM steps WHERE ($rank IS NULL OR rank = $rank) GROUP BY rank
),
_mem_fn_allocs AS (  -- the blocks made inside a functional collective in the last two steps, numbered per thread
  SELECT s.rank, s.device_type, s.device_id, s.pid, s.tid, s.event_id, s.bytes, s.ts_ns >= l.ts_ns AS in_last,
         row_number() OVER w AS k, count(*) OVER w AS n,
         coalesce(s.next_bytes < 0 AND s.next_ts_ns >= l.ts_ns, false) AS held_over  -- freed only after its step
  FROM _mem_seq s JOIN _mem_last_step l ON l.rank = s.rank
  WHERE s.device_type = 0 AND s.bytes > 0 AND s.ts_ns >= l.prev_ts_ns
    AND EXISTS (SELECT 1 FROM _mem_buffer_ranges r
                WHERE r.functional AND r.rank = s.rank AND r.pid = s.pid AND r.tid = s.tid
                  AND s.ts_ns >= r.ts_ns AND s.ts_ns < r.end_ns)
  WINDOW w AS (PARTITION BY s.rank, s.device_type, s.device_id, s.pid, s.tid, s.ts_ns >= l.ts_ns
               ORDER BY s.ts_ns, s.event_id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
_mem_fn_not_held AS (  -- a last step's block whose counterpart one step before (same thread, place, size) was not
  SELECT a.rank, a.device_type, a.device_id, a.event_id  -- held past its step: the loop does not hold it either
  FROM _mem_fn_allocs a
  JOIN _mem_fn_allocs p ON p.rank = a.rank AND p.device_type = a.device_type AND p.device_id = a.device_id
                       AND p.pid = a.pid AND p.tid = a.tid AND NOT p.in_last AND p.k = a.k AND p.n = a.n
                       AND p.bytes = a.bytes
  WHERE a.in_last AND NOT p.held_over
),
_mem_range_buffers AS (  -- an orphan made in one, before its process group's call: the call that moves it
  SELECT o.rank, o.device_type, o.device_id, o.event_id, c.ts_ns AS call_ts_ns
  FROM _mem_orphans o
  JOIN _mem_buffer_ranges r ON r.rank = o.rank AND r.pid = o.pid AND r.tid = o.tid
                           AND o.ts_ns >= r.ts_ns AND o.ts_ns < r.end_ns
  ASOF JOIN (SELECT * FROM _mem_calls WHERE starts_with(name, 'c10d::')) c
    ON c.rank = o.rank AND c.pid = o.pid AND c.tid = o.tid AND c.ts_ns >= o.ts_ns
  LEFT JOIN _mem_last_step l ON l.rank = o.rank
  LEFT JOIN _mem_fn_not_held h ON h.rank = o.rank AND h.device_type = o.device_type AND h.device_id = o.device_id
                              AND h.event_id = o.event_id
  WHERE c.ts_ns < r.end_ns
    -- a functional collective's output is its caller's: one live at the trace's end and made in its last step (or
    -- in a trace without steps) may be held still, unless the same call's output one step before was dropped or
    -- freed within its step; one whose address was reused, or that outlived a step boundary with no free (a
    -- collective's output in a training loop does not), was dropped by the backend's worker
    AND (NOT r.functional OR o.reused OR o.ts_ns < l.ts_ns OR h.event_id IS NOT NULL)
),
_mem_transfers AS (
  SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns FROM events
  WHERE ph = 'X' AND starts_with(name, 'gloo:') AND dur_ns > 0 AND ($rank IS NULL OR rank = $rank)
),
_mem_orphan_done AS (  -- the first transfer that began once the call had (a nested call: the innermost's)
  SELECT o.rank, o.device_type, o.device_id, o.event_id, arg_max(t.end_ns, o.call_ts_ns) AS done_ns
  FROM (SELECT * FROM _mem_orphan_calls UNION ALL SELECT * FROM _mem_range_buffers) o
  ASOF JOIN _mem_transfers t ON t.rank = o.rank AND t.ts_ns >= o.call_ts_ns
  GROUP BY o.rank, o.device_type, o.device_id, o.event_id
),
_mem_orphan_end AS (
  SELECT o.rank, o.device_type, o.device_id, o.event_id, e.event_id AS end_event_id, e.ts_ns AS end_ts_ns
  FROM _mem_orphan_done o
  ASOF JOIN _mem_raw e ON e.rank = o.rank AND e.device_type = o.device_type AND e.device_id = o.device_id
                       AND e.ts_ns >= o.done_ns
),
_mem_block_ends AS (
  SELECT s.rank, s.device_type, s.device_id, s.pid, s.tid, s.event_id AS alloc_event_id, s.ts_ns AS alloc_ts_ns,
         s.bytes,
         CASE WHEN x.after_transfer THEN x.end_event_id ELSE s.next_event_id END AS end_event_id,
         CASE WHEN x.after_transfer THEN x.end_ts_ns ELSE s.next_ts_ns END AS end_ts_ns,
         CASE WHEN x.after_transfer THEN NULL ELSE s.next_pid END AS end_pid,
         CASE WHEN x.after_transfer THEN NULL ELSE s.next_tid END AS end_tid,
         s.device_type = 0 AND (coalesce(s.next_bytes > 0, false) OR x.end_event_id IS NOT NULL) AS lost
  FROM _mem_seq s
  LEFT JOIN (SELECT *, true AS after_transfer FROM _mem_orphan_end) x
    ON x.rank = s.rank AND x.device_type = s.device_type AND x.device_id = s.device_id AND x.event_id = s.event_id
   AND (s.next_ts_ns IS NULL OR x.end_ts_ns < s.next_ts_ns)  -- its transfer's end, where before the reuse
  WHERE s.bytes > 0
),
_mem_lost AS (
  SELECT rank, device_type, device_id, end_event_id AS event_id, sum(bytes) AS lost_bytes
  FROM _mem_block_ends WHERE lost
  GROUP BY ALL
),
_mem_events AS (
  SELECT e.* REPLACE (e.total_allocated - e.lost_free_bytes AS total_allocated)
  FROM (SELECT e.*, coalesce(sum(l.lost_bytes) OVER (PARTITION BY e.rank, e.device_type, e.device_id
                                                    ORDER BY e.ts_ns, e.event_id ROWS UNBOUNDED PRECEDING), 0)::BIGINT
                    AS lost_free_bytes
        FROM _mem_raw e
        LEFT JOIN _mem_lost l ON l.rank = e.rank AND l.device_type = e.device_type AND l.device_id = e.device_id
                             AND l.event_id = e.event_id) e
),
