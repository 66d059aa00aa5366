-- Matched collectives: one row per collective instance across ranks, with its participants, arrival skew,
-- transfer time, bandwidth (nccl-tests algbw / busbw) and the group members missing from the trace set.
--
-- transfer_ns runs from the moment the last participant began working on it (its kernel started; on gloo, a
-- worker thread took it from the queue) to the first finish, when every participant was still running then
-- (the data can only move then), else the shortest participant's time at work (TraceLens's transfer time).
-- Queueing behind earlier gloo collectives is each participant's queued_ns (collectives), not transfer.
-- A sampled trace set (2 of 128 ranks) is reported, not refused: ranks_not_traced lists the absent members
-- and complete is false.
--
-- @column match_key         cross-rank key (see collectives)
-- @column match_by          comms_id | seq | p2p | ordinal | inspector
-- @column source            kineto | nccl_inspector (the same collective can appear once from each)
-- @column op                collective op (the most common across participants)
-- @column pg_name           process group name (NULL when the trace does not say)
-- @column pg_desc           process group description
-- @column group_size        ranks in the process group
-- @column dtype             element type
-- @column bytes             bytes of the collective (nccl-tests convention), the largest any participant reports
-- @column step              lowest ProfilerStep#N among the participants
-- @column timeline          gpu | cpu | none (no participant's kernel in the trace)
-- @column participants      ranks that recorded it
-- @column n_participants    how many
-- @column ranks_not_traced  group members without a trace in this set
-- @column ranks_missing     group members with a trace but without this collective
-- @column complete          every group member recorded it (Inspector: as many participants as the communicator has)
-- @column consistent        every participant reports the same op and size
-- @column first_arrival_ns  earliest start_ns
-- @column last_arrival_ns   latest start_ns
-- @column first_arrival_rank rank that arrived first
-- @column last_arrival_rank rank that arrived last
-- @column arrival_skew_ns   last_arrival_ns - first_arrival_ns
-- @column first_end_ns      earliest finish
-- @column last_end_ns       latest finish
-- @column min_dur_ns        shortest participant duration
-- @column median_dur_ns     median participant duration
-- @column transfer_ns       time the data moved (see above)
-- @column algbw_gbps        bytes / transfer_ns, GB/s (1e9 bytes/s)
-- @column busbw_factor      nccl-tests factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; else 1
-- @column busbw_gbps        algbw_gbps * busbw_factor
SELECT match_key, match_by, source, op, pg_name, pg_desc, group_size, dtype, bytes, step, timeline,
       participants, n_participants, ranks_not_traced, ranks_missing,
       coalesce(len(ranks_not_traced) = 0 AND len(ranks_missing) = 0, n_participants = group_size) AS complete,
       op_variants = 1 AND bytes_variants <= 1 AS consistent,
       first_arrival_ns, last_arrival_ns, first_arrival_rank, last_arrival_rank, arrival_skew_ns,
       first_end_ns, last_end_ns, min_dur_ns, median_dur_ns, transfer_ns,
       bytes / nullif(transfer_ns, 0) AS algbw_gbps, busbw_factor,
       bytes / nullif(transfer_ns, 0) * busbw_factor AS busbw_gbps
FROM _comm_matched
WHERE ($op IS NULL OR op = $op)
ORDER BY first_arrival_ns NULLS LAST, match_key
