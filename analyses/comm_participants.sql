-- Collective participants for the dependency graph: one row per (rank, collective) that has a timeline in
-- the trace (a GPU kernel, or a gloo call on the CPU), on the raw trace clocks, with the events it is made
-- of. Read by analyses.depgraph; the user-facing per-rank view is collectives.sql.
--
-- @column rank              global rank
-- @column match_key         cross-rank key of the collective instance (see collectives)
-- @column op                what the backend ran: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast,
--                           barrier, send, recv ...
-- @column bytes             bytes of that collective, nccl-tests convention (NULL when unknown)
-- @column group_size        ranks in the process group
-- @column pg_name           process group name (NULL when the trace does not say)
-- @column pg_ranks          ranks of the process group (the whole world when the trace names none): one list per group,
--                           shared by its rows
-- @column pg_id             the process group's member list as a key: rows with one pg_id share one pg_ranks
-- @column timeline          gpu (NCCL kernel) | cpu (gloo call + runloop)
-- @column cpu_event_id      event_id of the c10d::* call (NULL: a kernel no call launched)
-- @column cpu_tid           thread of that call
-- @column kernel_event_id   event_id of the first NCCL/RCCL kernel the call launched (NULL on cpu timelines)
-- @column runloop_event_id  event_id of the gloo runloop's annotation paired with the call (NULL: none)
-- @column nested_event_id   the gloo:* annotation that opens inside the call on its thread and outlasts it (NULL:
--                           none): gloo's send and recv run on the caller's transport, and their annotation closes
--                           when the message has gone (or come), while the thread runs on
-- @column nested_start_ns   its start (the transfer is posted then)
-- @column nested_end_ns     its end: when the message had gone (or come) on this rank
-- @column call_op           the op the call asked for, where the backend ran another (gloo runs a reduce-scatter
--                           as an all-reduce: op says what went over the network, call_op what the program called)
-- @column p2p_src           a send's or recv's sending rank (global; NULL: not point-to-point, or unknown)
-- @column p2p_dst           its receiving rank
SELECT r.rank, r.match_key, r.wire_op AS op, r.wire_bytes AS bytes, r.group_size, r.pg_name, r.pg_ranks, r.pg_id, r.timeline,
       r.cpu_event_id, r.cpu_tid, r.kernel_event_id, p.event_id AS runloop_event_id,
       -- _comm_rows_raw keeps nested_end_ns only for an annotation of the call's that outlasts it
       CASE WHEN r.nested_end_ns IS NOT NULL THEN n.event_id END AS nested_event_id,
       CASE WHEN r.nested_end_ns IS NOT NULL THEN n.ts_ns END AS nested_start_ns, r.nested_end_ns,
       r.op AS call_op, r.p2p_src, r.p2p_dst
FROM _comm_trace_rows r
LEFT JOIN _comm_loose_pairs p ON p.rank = r.rank AND p.call_event_id = r.cpu_event_id
LEFT JOIN _comm_nested_annotations n ON n.rank = r.rank AND n.call_event_id = r.cpu_event_id
WHERE r.rank IN (SELECT unnest($ranks::BIGINT[])) AND r.timeline IN ('gpu', 'cpu')
ORDER BY r.match_key, r.rank
