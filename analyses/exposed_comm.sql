-- Exposed communication per step and rank: communication time that no compute hides.
--
-- GPU ranks: exactly comm_comp_overlap(by_step=True)'s figures (same _overlap.sql fragment, same kernel
-- classes): communication kernels against compute kernels of the step. gloo (CPU) ranks: communication is
-- each collective as the collectives analysis spans it (the c10d call start -> the end of the gloo runloop's
-- work, raw trace clocks), compute is the non-communication CPU operators (cpu_op) on the thread(s) that
-- called collectives, except operators that enclose a call or sit inside one. Exposed = communication time
-- during which that thread runs no compute op: a rank that arrives early and waits for a late one shows
-- the wait here. Why not annotations or enclosing ops: work.wait() records no event, so a region around it
-- (DistributedDataParallel.forward around DDP's buffer broadcast, the autograd node whose hook launched
-- the all-reduce) spans the blocked time and would count the wait as hidden.
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
WITH _gloo_calls AS (
  -- collectives of ranks whose collectives ran on gloo (timeline 'cpu' in the collectives analysis)
  SELECT rank, step, cpu_tid, cpu_start_ns, cpu_end_ns, greatest(runloop_end_ns, cpu_end_ns) AS comm_end_ns
  FROM _comm_rows_raw
  WHERE timeline = 'cpu' AND ($rank IS NULL OR rank = $rank)
),
_calling_threads AS (SELECT DISTINCT rank, cpu_tid AS tid FROM _gloo_calls),
_iv AS (
  SELECT 'gpu' AS timeline, rank, step, ts_ns, end_ns, kernel_class
  FROM _gpu_ops_in_scope($rank, $step, false)
  WHERE step IS NOT NULL AND dur_ns IS NOT NULL
  UNION ALL
  SELECT 'cpu', rank, step, cpu_start_ns, comm_end_ns, 'communication' FROM _gloo_calls
  WHERE step IS NOT NULL AND ($step IS NULL OR step = $step)
  UNION ALL
  SELECT 'cpu', w.rank, w.step, w.ts_ns, w.end_ns, w.kernel_class
  FROM _cpu_work_in_scope($rank, $step) w
  SEMI JOIN _calling_threads t ON t.rank = w.rank AND t.tid = w.tid
  WHERE w.kernel_class = 'compute' AND w.cat = 'cpu_op' AND w.step IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM _gloo_calls c
                    WHERE c.rank = w.rank AND c.cpu_tid = w.tid
                      AND ((w.ts_ns <= c.cpu_start_ns AND w.end_ns >= c.cpu_end_ns)
                           OR (w.ts_ns >= c.cpu_start_ns AND w.end_ns <= c.cpu_end_ns)))
),
-- @include _overlap
SELECT o.rank, o.step, o.timeline, o.comm_count, o.comm_ns, o.overlap_ns AS overlapped_ns, o.exposed_comm_ns,
       100.0 - o.overlap_pct AS exposed_pct,
       s.dur_ns AS step_ns,
       100.0 * o.exposed_comm_ns / nullif(s.dur_ns, 0) AS exposed_step_pct
FROM _overlap_rows o
LEFT JOIN steps s ON s.rank = o.rank AND s.step = o.step
ORDER BY o.rank, o.step, o.timeline
