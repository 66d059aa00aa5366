-- Exposed communication per step and rank: communication time that no compute hides.
--
-- The one definition of exposed communication: `tracekit whatif` (measured and predicted: the replayed run is
-- a store like any other), doctor and the report all read this analysis.
--
-- GPU ranks: exactly comm_comp_overlap(by_step=True)'s figures (same _overlap.sql fragment, same kernel
-- classes): communication kernels against compute kernels of the step. gloo (CPU) ranks: communication is
-- each collective on the rank from its call to its completion there (the end of the gloo runloop's work; for
-- a send or recv, whose call returns at once, the end of the gloo:send / gloo:recv annotation: the message has
-- gone or come), raw trace clocks; compute is the innermost CPU operators (cpu_op with no operator nested
-- inside) of the thread(s) that called collectives, except communication operators (c10d::*, functional
-- collectives and their wait_tensor) and operators inside a call. Exposed = communication time during which
-- that thread runs no compute operator: a rank that arrives early and waits for a late one shows the wait here.
-- Why innermost operators, not enclosing ones or annotations: a thread blocked in Work.wait() records no event,
-- so the region around the wait (DistributedDataParallel.forward around DDP's buffer broadcast, the autograd
-- node whose hook waits for a bucket, FSDP's all-gather) spans the blocked time and would count it as hidden.
-- A rank with GPU kernels and gloo collectives gets both timelines' rows.
--
-- @column rank              global rank
-- @column step              ProfilerStep#N (of the kernel's launch on a GPU rank, of the call on a CPU rank)
-- @column timeline          gpu: GPU kernels; cpu: gloo collectives against the calling thread's CPU ops
-- @column comm_count        communication kernels (gpu) or collectives (cpu) in the step
-- @column comm_ns           union of communication time in the step, ns
-- @column overlapped_ns     communication time with compute running, ns
-- @column exposed_comm_ns   comm_ns - overlapped_ns: communication time not hidden behind compute, ns
-- @column exposed_pct       exposed_comm_ns / comm_ns, percent (NULL without communication)
-- @column step_ns           duration of the ProfilerStep#N annotation (CPU side), ns
-- @column exposed_step_pct  exposed_comm_ns / step_ns, percent
-- @column is_last_step      the rank's last ProfilerStep (often cut short by the profiler: the per-rank figure,
--                           exposed_comm_per_rank, leaves it out when the rank has other steps)
WITH _gloo_calls AS (
  -- collectives of ranks whose collectives ran on gloo (timeline 'cpu' in the collectives analysis)
  SELECT rank, step, cpu_tid, cpu_start_ns, cpu_end_ns,
         greatest(runloop_end_ns, cpu_end_ns, nested_end_ns) AS comm_end_ns
  FROM _comm_rows_raw
  WHERE timeline = 'cpu' AND ($rank IS NULL OR rank = $rank)
),
_calling_threads AS (SELECT DISTINCT rank, cpu_tid AS tid FROM _gloo_calls),
_thread_ops AS (
  SELECT o.rank, o.step, o.tid, o.name, o.ts_ns, o.end_ns,
         lead(o.ts_ns) OVER (PARTITION BY o.rank, o.pid, o.tid ORDER BY o.ts_ns, o.end_ns DESC, o.event_id) AS next_ts_ns
  FROM cpu_ops o SEMI JOIN _calling_threads t ON t.rank = o.rank AND t.tid = o.tid
  WHERE o.dur_ns IS NOT NULL AND ($rank IS NULL OR o.rank = $rank)
),
_iv AS (
  SELECT 'gpu' AS timeline, rank, step, ts_ns, end_ns, kernel_class
  FROM _gpu_ops_in_scope($rank, $step, false)
  WHERE step IS NOT NULL AND dur_ns IS NOT NULL
  UNION ALL
  SELECT 'cpu', rank, step, cpu_start_ns, comm_end_ns, 'communication' FROM _gloo_calls
  WHERE step IS NOT NULL AND ($step IS NULL OR step = $step)
  UNION ALL
  SELECT 'cpu', w.rank, w.step, w.ts_ns, w.end_ns, 'compute'
  FROM _thread_ops w
  WHERE (w.next_ts_ns IS NULL OR w.next_ts_ns >= w.end_ns) AND w.end_ns > w.ts_ns
    AND NOT _cpu_op_is_comm(w.name) AND w.step IS NOT NULL AND ($step IS NULL OR w.step = $step)
    AND NOT EXISTS (SELECT 1 FROM _gloo_calls c
                    WHERE c.rank = w.rank AND c.cpu_tid = w.tid AND w.ts_ns >= c.cpu_start_ns AND w.end_ns <= c.cpu_end_ns)
),
-- @include _overlap
SELECT o.rank, o.step, o.timeline, o.comm_count, o.comm_ns, o.overlap_ns AS overlapped_ns, o.exposed_comm_ns,
       100.0 - o.overlap_pct AS exposed_pct,
       s.dur_ns AS step_ns,
       100.0 * o.exposed_comm_ns / nullif(s.dur_ns, 0) AS exposed_step_pct,
       coalesce(s.is_last, false) AS is_last_step
FROM _overlap_rows o
LEFT JOIN steps s ON s.rank = o.rank AND s.step = o.step
ORDER BY o.rank, o.step, o.timeline
