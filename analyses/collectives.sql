-- Collectives per rank: one row per (rank, collective) with its process group, op, sizes, CPU call and GPU
-- kernel, its cross-rank match key, and how long it waited for the other participants.
--
-- Sources: NCCL traces (record_param_comms / kernel args; else the c10d op's Input Dims and the dtype in the
-- kernel name), gloo traces (c10d::* call on the main thread paired by order with the gloo:* annotation on
-- the runloop thread; the group from distributedInfo). Times are ns on the trace clocks plus clock_offset_ns.
--
-- @column rank              global rank
-- @column source            kineto (the traces) | nccl_inspector (NCCL Inspector logs in the trace directory)
-- @column step              ProfilerStep#N of the call (of the kernel's launch without a call)
-- @column match_key         cross-rank key: id:<Comms Id>, else pg:<group>:seq:<Seq>, else for a c10d send / recv
--                           whose call names its peer p2p:<group>:<src>><dst>:tag:<tag>:n:<n-th such message>,
--                           else pg:<group>:n:<ordinal>; Inspector rows: nccl:<comm hash>:sn:<coll_sn>
-- @column match_by          comms_id | seq | p2p | ordinal
-- @column ordinal           n-th collective of this process group on this rank, by time
-- @column pg_name           process group name ('world'-keyed NULL when the trace does not say)
-- @column pg_desc           process group description
-- @column pg_ranks          ranks of the process group (the whole world when the trace names none): one list per group,
--                           shared by its rows
-- @column pg_id             the member list as a key: rows with one pg_id share one pg_ranks (NULL: unknown)
-- @column pg_source         where the group came from: args, distributedInfo, world (assumed)
-- @column group_size        ranks in the process group
-- @column op                all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, barrier, send, recv ...
-- @column coll_name         collective name as NCCL's record_param_comms gives it (NULL without metadata)
-- @column dtype             element type as the trace spells it
-- @column elem_bytes        bytes per element
-- @column in_nelems         input elements
-- @column out_nelems        output elements (NULL when unknown)
-- @column bytes             bytes of the collective, nccl-tests convention (all_gather: output, reduce_scatter: input)
-- @column size_source       args (collective metadata), input_dims (the call's Input Dims) or annotation (the
--                           nccl:* / gloo:* annotation's Input Dims); NULL: the trace keeps no size for it
-- @column timeline          gpu (kernel), cpu (gloo call + runloop), none (GPU rank whose kernel is outside the trace)
-- @column cpu_name          the c10d::* call (or record_param_comms)
-- @column cpu_event_id      event_id of the call
-- @column cpu_start_ns      start of the call
-- @column cpu_end_ns        end of the call
-- @column kernel_name       first NCCL/RCCL kernel the call launched
-- @column kernel_event_id   event_id of that kernel
-- @column kernel_count      kernels the call launched
-- @column kernel_start_ns   first kernel start
-- @column kernel_end_ns     last kernel end
-- @column annotation_name   nccl:* / gloo:* annotation paired with the call
-- @column runloop_tid       gloo runloop thread that ran the collective
-- @column runloop_start_ns  start of the runloop's work
-- @column runloop_end_ns    end of the runloop's work
-- @column clock_offset_ns   correction added to this rank's times (0 unless aligned)
-- @column start_ns          arrival: kernel start (gpu) or call start (cpu)
-- @column end_ns            finish: kernel end, or runloop / call end
-- @column dur_ns            end_ns - start_ns (Inspector: its exec time, known without start/end)
-- @column arrival_delay_ns  start_ns - first arrival among the participants
-- @column is_last_arrival   this rank arrived last (of two or more timed participants)
-- @column wait_ns           dur_ns - transfer_ns - queued_ns of the matched collective: time spent waiting for
--                           the others (the queueing for a free gloo worker is queued_ns), >= 0
-- @column work_start_ns     when the rank began working on it: kernel start (gpu), or when a gloo worker thread
--                           took it from the queue (cpu: runloop start, else the call)
-- @column queued_ns         work_start_ns - start_ns on a gloo rank: waiting behind earlier collectives for a free
--                           worker thread (NULL on GPU ranks)
SELECT r.rank, r.source, r.step, r.match_key, r.match_by, r.ordinal, r.pg_name, r.pg_desc, r.pg_ranks, r.pg_id, r.pg_source, r.group_size,
       r.op, r.coll_name, r.dtype, r.elem_bytes, r.in_nelems, r.out_nelems, r.bytes, r.size_source, r.timeline,
       r.cpu_name, r.cpu_event_id, r.cpu_start_ns, r.cpu_end_ns, r.kernel_name, r.kernel_event_id, r.kernel_count,
       r.kernel_start_ns, r.kernel_end_ns, r.annotation_name, r.runloop_tid, r.runloop_start_ns, r.runloop_end_ns,
       r.clock_offset_ns, r.start_ns, r.end_ns, r.dur_ns,
       r.start_ns - m.first_arrival_ns AS arrival_delay_ns,
       coalesce(m.n_timed >= 2 AND r.rank = m.last_arrival_rank, false) AS is_last_arrival,
       greatest(r.dur_ns - m.transfer_ns - coalesce(r.queued_ns, 0), 0) AS wait_ns, r.work_start_ns, r.queued_ns
FROM _comm_rows r JOIN _comm_matched m USING (match_key)
WHERE ($rank IS NULL OR r.rank = $rank) AND ($op IS NULL OR r.op = $op)
ORDER BY r.rank, r.pg_name NULLS FIRST, r.ordinal
