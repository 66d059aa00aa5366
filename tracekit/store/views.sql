-- Public views over the store's tables. Private helpers start with "_".
-- All times are int64 ns on the trace clock; durations are *_ns.
-- Which categories are device ops and runtime calls: the macros device_op_kind(cat), is_device_op(cat) and
-- is_device_runtime(cat), installed from store/devices.py (CUDA, ROCm, MTIA, Intel XPU, PrivateUse1).

-- ranks: one row per rank (source trace). Columns: see store/schema.py RANK_COLUMNS, plus
--   rank  the global rank
CREATE OR REPLACE VIEW ranks AS SELECT * FROM _ranks;

-- events: every trace event of every rank (X, i, C, s/f, M ...). Columns: schema.py EVENT_COLUMNS, plus
--   rank    the global rank
--   end_ns  ts_ns + dur_ns (ts_ns for events without duration)
-- The sparse args (GPU op details, collective metadata, [memory] args) are stored in their own
-- tables and joined back here.
CREATE OR REPLACE VIEW events AS
SELECT e.*, g.* EXCLUDE (rank, event_id), c.* EXCLUDE (rank, event_id),
       m.addr AS mem_addr, m.bytes AS mem_bytes, m.total_allocated AS mem_total_allocated,
       m.total_reserved AS mem_total_reserved, m.device_type AS mem_device_type, m.device_id AS mem_device_id,
       e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns
FROM _events e
LEFT JOIN _gpu_args g ON e.rank = g.rank AND e.event_id = g.event_id
LEFT JOIN _comm_args c ON e.rank = c.rank AND e.event_id = c.event_id
LEFT JOIN _memory m ON e.rank = m.rank AND e.event_id = m.event_id;

-- gpu_args, comm_args: the sparse args tables (schema.py GPU_ARG_COLUMNS, COMM_ARG_COLUMNS, plus rank).
CREATE OR REPLACE VIEW gpu_args AS SELECT * FROM _gpu_args;
CREATE OR REPLACE VIEW comm_args AS SELECT * FROM _comm_args;

-- steps: ProfilerStep#N annotations per rank (schema.py STEP_COLUMNS, plus rank).
CREATE OR REPLACE VIEW steps AS SELECT * FROM _steps;

-- flows: s/f flow pairs per rank (ac2g = launch -> GPU op; fwdbwd = forward -> backward).
CREATE OR REPLACE VIEW flows AS SELECT * FROM _flows;

-- fr_entries: flight-recorder entries per rank (schema.py FR_COLUMNS, plus rank).
CREATE OR REPLACE VIEW fr_entries AS SELECT * FROM _fr_entries;

-- nccl_tests: nccl-tests reference rows (schema.py NCCL_TESTS_COLUMNS; rank is -1: no rank's).
CREATE OR REPLACE VIEW nccl_tests AS SELECT * FROM _nccl_tests;

-- run_manifest: the run's run.json, one row (schema.py RUN_MANIFEST_COLUMNS; rank is -1: no rank's; no rows
--   when the trace directory had none). Python: Store.run_manifest() / Run.run_manifest() give it parsed.
CREATE OR REPLACE VIEW run_manifest AS SELECT * FROM _run_manifest;

-- nccl_inspector: NCCL Inspector records per rank (schema.py NCCL_INSPECTOR_COLUMNS, plus rank).
CREATE OR REPLACE VIEW nccl_inspector AS SELECT * FROM _nccl_inspector;

-- memory: [memory] instant events (allocations and frees) per rank.
CREATE OR REPLACE VIEW memory AS SELECT * FROM _memory;

-- _cpu_step: the step whose CPU span holds a CPU-side timestamp (one row per rank/step).
CREATE OR REPLACE VIEW _step_spans AS SELECT rank, step, ts_ns AS step_start_ns, end_ns AS step_end_ns FROM _steps;

-- runtime: device runtime and driver calls (CUDA/HIP, MTIA, XPU ...: launches, memcpy calls, syncs), with
--   step  ProfilerStep#N that the call falls in (NULL outside every step)
CREATE OR REPLACE VIEW runtime AS
SELECT e.*, CASE WHEN e.ts_ns < s.step_end_ns THEN s.step END AS step
FROM (SELECT * FROM events WHERE ph = 'X' AND is_device_runtime(cat)) e
ASOF LEFT JOIN _step_spans s ON e.rank = s.rank AND e.ts_ns >= s.step_start_ns;

-- cpu_ops: operators recorded on CPU threads (cat cpu_op), with
--   step  ProfilerStep#N that the op starts in (NULL outside every step)
CREATE OR REPLACE VIEW cpu_ops AS
SELECT e.*, CASE WHEN e.ts_ns < s.step_end_ns THEN s.step END AS step
FROM (SELECT * FROM events WHERE ph = 'X' AND cat = 'cpu_op') e
ASOF LEFT JOIN _step_spans s ON e.rank = s.rank AND e.ts_ns >= s.step_start_ns;

-- _launch: one launching runtime call per (rank, correlation)
CREATE OR REPLACE VIEW _launch AS
SELECT rank, correlation, min(ts_ns) AS launch_ts_ns, arg_min(dur_ns, ts_ns) AS launch_dur_ns,
       arg_min(name, ts_ns) AS launch_name, arg_min(tid, ts_ns) AS launch_tid, arg_min(step, ts_ns) AS step
FROM runtime WHERE correlation IS NOT NULL GROUP BY rank, correlation;

-- gpu_ops: device ops (kernels, memcpys and memsets on GPU streams, MTIA's CCP events, XPU ops ...), with
--   kind            kernel | memcpy | memset (device_op_kind of the category)
--   launch_ts_ns    start of the runtime call that launched the op (NULL: not found)
--   launch_dur_ns   duration of that call
--   launch_name     name of that call (cudaLaunchKernel, ...)
--   launch_tid      CPU thread of that call
--   step            ProfilerStep#N of the launching call
CREATE OR REPLACE VIEW gpu_ops AS
SELECT e.*, device_op_kind(e.cat) AS kind,
       l.launch_ts_ns, l.launch_dur_ns, l.launch_name, l.launch_tid, l.step
FROM (SELECT * FROM events WHERE ph = 'X' AND is_device_op(cat)) e
LEFT JOIN _launch l ON e.rank = l.rank AND e.correlation = l.correlation;

-- kernels: gpu_ops of kind kernel (same columns).
CREATE OR REPLACE VIEW kernels AS SELECT * FROM gpu_ops WHERE kind = 'kernel';
