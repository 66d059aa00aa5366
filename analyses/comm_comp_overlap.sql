-- Communication-computation overlap: how much of each rank's (or step's) communication runs under compute.
--
-- comm_ns = union of communication kernels; overlap_ns = time when a communication kernel and a compute
-- kernel run at the same time; overlap_pct = overlap_ns / comm_ns (HolisticTraceAnalysis's ratio);
-- exposed_comm_ns = comm_ns - overlap_ns, the communication time nothing hides. Ranks without GPU ops
-- get the same figures over CPU ops (timeline = 'cpu': c10d/gloo ops against the other CPU ops).
--
-- @column rank             global rank
-- @column step             ProfilerStep#N (by_step), NULL for the whole rank
-- @column timeline         gpu: GPU ops; cpu: CPU ops of a rank without GPU activity
-- @column comm_count       communication kernels (or ops) counted
-- @column comm_ns          union of communication kernels, ns
-- @column compute_ns       union of compute kernels, ns
-- @column overlap_ns       time communication and compute both run, ns
-- @column overlap_pct      overlap_ns / comm_ns, percent (NULL without communication)
-- @column exposed_comm_ns  comm_ns - overlap_ns, ns
WITH
-- @include _timeline_ops
-- the union / sweep lives in _overlap.sql, shared with exposed_comm
-- @include _overlap
SELECT rank, step, timeline, comm_count, comm_ns, compute_ns, overlap_ns, overlap_pct, exposed_comm_ns
FROM _overlap_rows
ORDER BY rank, step NULLS FIRST, timeline
