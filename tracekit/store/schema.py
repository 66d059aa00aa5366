"""The store's schema: the one contract between ingest, analyses and replay.

Bump SCHEMA_VERSION whenever a stored column changes meaning or type; a store
written under another version is re-ingested rather than misread.

Times are int64 nanoseconds on the trace's own clock (absolute: base time plus
relative timestamp for new-style traces, epoch microseconds x 1000 for old-style).
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 6  # 2: fr_entries table; 3: sparse gpu/comm args in their own tables; 4: nccl_tests, nccl_inspector;
# 5: run_manifest (run.json kept in the store); 6: steps are the host's ProfilerStep annotations only (a
# trace that mirrors them on the GPU, gpu_user_annotation, had each step twice)
CACHE_DIR = "cache"  # derived data the analyses keep between connections (Store.cache_file); commits clear it


@dataclass(frozen=True)
class ArgColumn:
    column: str  # column name in the events table
    key: str  # key inside the Kineto event's "args" object
    sql_type: str  # DuckDB type; JSON-valued args are kept as their JSON text
    doc: str
    group: str = "common"  # which events carry it: common, gpu, comm, memory (ingest reads
    # each group only from the events that can have it, which keeps ingest fast)


# Declarative map of Kineto args to typed columns (HTA keeps a similar versioned
# map). Every arg, typed or not, is also kept verbatim in events.args_json.
ARG_COLUMNS: tuple[ArgColumn, ...] = (
    ArgColumn("external_id", "External id", "BIGINT", "links cpu_op <-> runtime launch"),
    ArgColumn("correlation", "correlation", "BIGINT", "links runtime launch <-> GPU op"),
    ArgColumn("device", "device", "BIGINT", "GPU index of a GPU op"),
    ArgColumn("stream", "stream", "BIGINT", "CUDA/HIP stream of a GPU op"),
    ArgColumn("cbid", "cbid", "BIGINT", "CUPTI callback id of a runtime/driver call"),
    ArgColumn("ev_idx", "Ev Idx", "BIGINT", "profiler event index"),
    ArgColumn("record_function_id", "Record function id", "BIGINT", "RecordFunction id"),
    ArgColumn("sequence_number", "Sequence number", "BIGINT", "autograd sequence number (fwd<->bwd)"),
    ArgColumn("fwd_thread_id", "Fwd thread id", "BIGINT", "forward thread of a backward op"),
    ArgColumn("input_dims", "Input Dims", "VARCHAR", "JSON list of input shapes"),
    ArgColumn("input_types", "Input type", "VARCHAR", "JSON list of input dtypes"),
    ArgColumn("input_strides", "Input Strides", "VARCHAR", "JSON list of input strides"),
    ArgColumn("concrete_inputs", "Concrete Inputs", "VARCHAR", "JSON list of scalar inputs"),
    ArgColumn("grid", "grid", "VARCHAR", "JSON [x, y, z] grid of a kernel", "gpu"),
    ArgColumn("block", "block", "VARCHAR", "JSON [x, y, z] block of a kernel", "gpu"),
    ArgColumn("registers_per_thread", "registers per thread", "BIGINT", "kernel registers", "gpu"),
    ArgColumn("shared_memory_bytes", "shared memory", "BIGINT", "kernel shared memory", "gpu"),
    ArgColumn("queued", "queued", "BIGINT", "queued flag of a GPU op", "gpu"),
    ArgColumn("blocks_per_sm", "blocks per SM", "DOUBLE", "kernel blocks per SM", "gpu"),
    ArgColumn("warps_per_sm", "warps per SM", "DOUBLE", "kernel warps per SM", "gpu"),
    ArgColumn("est_occupancy_pct", "est. achieved occupancy %", "DOUBLE", "estimated occupancy", "gpu"),
    ArgColumn("bytes", "bytes", "BIGINT", "bytes moved by a memcpy/memset", "gpu"),
    ArgColumn("memory_bw_gbps", "memory bandwidth (GB/s)", "DOUBLE", "memcpy/memset bandwidth", "gpu"),
    # communication metadata (record_param_comms and NCCL kernels)
    ArgColumn("coll_name", "Collective name", "VARCHAR", "collective op name", "comm"),
    ArgColumn("coll_dtype", "dtype", "VARCHAR", "collective element type", "comm"),
    ArgColumn("in_msg_nelems", "In msg nelems", "BIGINT", "input element count", "comm"),
    ArgColumn("out_msg_nelems", "Out msg nelems", "BIGINT", "output element count", "comm"),
    ArgColumn("in_split_size", "In split size", "VARCHAR", "JSON input splits", "comm"),
    ArgColumn("out_split_size", "Out split size", "VARCHAR", "JSON output splits", "comm"),
    ArgColumn("global_rank_start", "Global rank start", "BIGINT", "first global rank of the group", "comm"),
    ArgColumn("global_rank_stride", "Global rank stride", "BIGINT", "stride of global ranks", "comm"),
    ArgColumn("group_size", "Group size", "BIGINT", "process group size", "comm"),
    ArgColumn("pg_name", "Process Group Name", "VARCHAR", "process group name", "comm"),
    ArgColumn("pg_desc", "Process Group Description", "VARCHAR", "process group description", "comm"),
    ArgColumn("pg_ranks", "Process Group Ranks", "VARCHAR", "JSON list of the group's ranks", "comm"),
    ArgColumn("coll_rank", "Rank", "BIGINT", "rank recorded on the collective", "comm"),
    ArgColumn("seq", "Seq", "BIGINT", "collective sequence number in its group", "comm"),
    ArgColumn("comms_id", "Comms Id", "VARCHAR", "cross-rank collective id (2026 builds)", "comm"),
    # [memory] instant events
    ArgColumn("mem_addr", "Addr", "BIGINT", "allocation address", "memory"),
    ArgColumn("mem_bytes", "Bytes", "BIGINT", "allocation size (negative = free)", "memory"),
    ArgColumn("mem_total_allocated", "Total Allocated", "BIGINT", "allocated bytes after the event", "memory"),
    ArgColumn("mem_total_reserved", "Total Reserved", "BIGINT", "reserved bytes after the event", "memory"),
    ArgColumn("mem_device_type", "Device Type", "BIGINT", "0 = CPU, 1 = CUDA", "memory"),
    ArgColumn("mem_device_id", "Device Id", "BIGINT", "device index", "memory"),
)

# events: one row per trace event, every phase (X, i, C, s/f/t, M, ...). These are
# the columns of the `events` view; on disk the args of the "gpu" and "comm"
# groups live in the sparse tables gpu_args and comm_args and the "memory" group
# in the memory table (a NULL column in every row of a wide file costs ingest more
# than a join costs a query).
_EVENT_BASE: tuple[tuple[str, str, str], ...] = (
    ("event_id", "BIGINT", "index of the event in its file's traceEvents (stable id)"),
    ("ph", "VARCHAR", "phase: X complete, i instant, C counter, s/f flow, M metadata, ..."),
    ("cat", "VARCHAR", "category (cpu_op, kernel, cuda_runtime, ...); NULL when absent"),
    ("name", "VARCHAR", "event name"),
    ("pid", "BIGINT", "process id (device index for GPU events); NULL when not an integer"),
    ("tid", "BIGINT", "thread id (stream for GPU events); NULL when not an integer"),
    ("pid_label", "VARCHAR", "pid when the trace gives a string"),
    ("tid_label", "VARCHAR", "tid when the trace gives a string"),
    ("ts_ns", "BIGINT", "start, absolute ns on the trace clock; NULL when absent"),
    ("dur_ns", "BIGINT", "duration in ns (X events); NULL otherwise"),
    ("flow_id", "BIGINT", "event id (flows); NULL when absent or not an integer"),
    ("flow_id_label", "VARCHAR", "event id when the trace gives a string"),
    ("bp", "VARCHAR", "flow binding point"),
    ("scope", "VARCHAR", "instant event scope (s)"),
)
_ARGS_JSON = (("args_json", "VARCHAR", "the complete args object as compact JSON; NULL when absent"),)
_EVENT_ID = (("event_id", "BIGINT", "the event (events.event_id)"),)


def _args(group: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((a.column, a.sql_type, a.doc) for a in ARG_COLUMNS if a.group == group)


EVENT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    _EVENT_BASE + tuple((a.column, a.sql_type, a.doc) for a in ARG_COLUMNS) + _ARGS_JSON)
STORED_EVENT_COLUMNS = _EVENT_BASE + _args("common") + _ARGS_JSON
GPU_ARG_COLUMNS = _EVENT_ID + _args("gpu")  # kernels, memcpys, memsets
COMM_ARG_COLUMNS = _EVENT_ID + _args("comm")  # events with collective metadata

# Other tables (one file per source trace, hive-partitioned by rank).
RANK_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("world_size", "BIGINT", "world size from distributedInfo (NULL when unknown)"),
    ("backend", "VARCHAR", "process group backend (nccl, gloo, ...)"),
    ("rank_source", "VARCHAR", "where the rank came from: distributedInfo, filename, order, option"),
    ("hostname", "VARCHAR", "host name when the trace records it"),
    ("device_names", "VARCHAR", "JSON list of GPU names from deviceProperties"),
    ("source_file", "VARCHAR", "trace file, relative to the trace directory"),
    ("time_style", "VARCHAR", "relative (baseTimeNanoseconds + ts) or absolute (epoch us)"),
    ("base_time_ns", "BIGINT", "baseTimeNanoseconds, NULL for old-style traces"),
    ("clock_offset_ns", "BIGINT", "correction added to align this rank's clock (0 = none)"),
    ("event_count", "BIGINT", "events stored"),
    ("lost_event_count", "BIGINT", "events lost to truncation"),
    ("first_ts_ns", "BIGINT", "earliest event start"),
    ("last_end_ns", "BIGINT", "latest event end"),
    ("distributed_info_json", "VARCHAR", "distributedInfo as JSON (process groups, ...)"),
    ("device_properties_json", "VARCHAR", "deviceProperties as JSON"),
    ("trace_metadata_json", "VARCHAR", "every other top-level key of the trace as JSON"),
    ("warnings_json", "VARCHAR", "JSON list of warnings raised while ingesting"),
)

STEP_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "BIGINT", "N of ProfilerStep#N"),
    ("name", "VARCHAR", "annotation name"),
    ("ts_ns", "BIGINT", "CPU start of the step"),
    ("dur_ns", "BIGINT", "CPU duration of the step"),
    ("end_ns", "BIGINT", "CPU end of the step"),
    ("pid", "BIGINT", "process of the annotation"),
    ("tid", "BIGINT", "thread of the annotation"),
    ("gpu_start_ns", "BIGINT", "first start of a GPU op launched in the step (NULL: none)"),
    ("gpu_end_ns", "BIGINT", "last end of a GPU op launched in the step (NULL: none)"),
    ("is_last", "BOOLEAN", "last step of the trace (often cut short by the profiler)"),
)

FLOW_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("cat", "VARCHAR", "flow category: ac2g (launch -> GPU op), fwdbwd, ..."),
    ("flow_id", "BIGINT", "flow id (correlation for ac2g)"),
    ("flow_id_label", "VARCHAR", "flow id when not an integer"),
    ("start_event_id", "BIGINT", "event_id of the flow start (s)"),
    ("start_ts_ns", "BIGINT", "flow start time"),
    ("start_pid", "BIGINT", "flow start process"),
    ("start_tid", "BIGINT", "flow start thread"),
    ("end_event_id", "BIGINT", "event_id of the flow end (f)"),
    ("end_ts_ns", "BIGINT", "flow end time"),
    ("end_pid", "BIGINT", "flow end process"),
    ("end_tid", "BIGINT", "flow end thread"),
)

MEMORY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("event_id", "BIGINT", "event_id of the [memory] event"),
    ("ts_ns", "BIGINT", "time of the allocation or free"),
    ("pid", "BIGINT", "process"),
    ("tid", "BIGINT", "thread"),
    ("addr", "BIGINT", "address"),
    ("bytes", "BIGINT", "size; negative for a free"),
    ("total_allocated", "BIGINT", "allocated bytes after the event"),
    ("total_reserved", "BIGINT", "reserved bytes after the event"),
    ("device_type", "BIGINT", "0 = CPU, 1 = CUDA"),
    ("device_id", "BIGINT", "device index (-1 = CPU)"),
)

# fr_entries: one row per flight-recorder entry (ingest/flight_recorder.py), partitioned by rank.
FR_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("record_id", "BIGINT", "entry id in the rank's ring buffer"),
    ("pg_id", "BIGINT", "process group id"),
    ("pg_name", "VARCHAR", "process group name (entry's process_group[0])"),
    ("pg_desc", "VARCHAR", "process group description (process_group[1])"),
    ("pg_ranks", "VARCHAR", "JSON list of the group's ranks from pg_config (NULL when unknown)"),
    ("collective_seq_id", "BIGINT", "collective sequence number in the group"),
    ("p2p_seq_id", "BIGINT", "point-to-point sequence number"),
    ("is_p2p", "BOOLEAN", "a send/recv"),
    ("op_id", "BIGINT", "op id"),
    ("profiling_name", "VARCHAR", "nccl:all_reduce, gloo:broadcast, ..."),
    ("input_sizes", "VARCHAR", "JSON list of input shapes"),
    ("input_dtypes", "VARCHAR", "JSON list of input dtypes"),
    ("output_sizes", "VARCHAR", "JSON list of output shapes"),
    ("output_dtypes", "VARCHAR", "JSON list of output dtypes"),
    ("time_created_ns", "BIGINT", "when the collective was enqueued"),
    ("time_discovered_started_ns", "BIGINT", "when it was seen started (0/NULL: never)"),
    ("time_discovered_completed_ns", "BIGINT", "when it was seen completed (0/NULL: never)"),
    ("duration_ms", "DOUBLE", "measured duration (NCCL with timing enabled)"),
    ("timeout_ms", "BIGINT", "the collective's timeout"),
    ("state", "VARCHAR", "scheduled | started | completed"),
    ("retired", "BOOLEAN", "the work object was retired"),
    ("thread_id", "VARCHAR", "enqueuing thread"),
    ("thread_name", "VARCHAR", "enqueuing thread name"),
    ("frames_json", "VARCHAR", "JSON stack frames (NULL when absent)"),
    ("pg_last_enqueued_seq", "BIGINT", "pg_status: last collective enqueued in the group"),
    ("pg_last_started_seq", "BIGINT", "pg_status: last collective started"),
    ("pg_last_completed_seq", "BIGINT", "pg_status: last collective completed"),
    ("dump_version", "VARCHAR", "dump format version"),
    ("source_file", "VARCHAR", "dump file, relative to the trace directory"),
)

# nccl_tests: the reference curve of an nccl-tests run (ingest/nccl.py), under rank=-1 (no rank's).
NCCL_TESTS_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("op", "VARCHAR", "collective op tested (all_reduce, all_gather, ...), from the test binary's name"),
    ("size_bytes", "BIGINT", "message size, nccl-tests convention (all_gather: output buffer)"),
    ("count", "BIGINT", "elements"),
    ("dtype", "VARCHAR", "element type as nccl-tests names it (float, half, ...)"),
    ("redop", "VARCHAR", "reduction op (sum, ...; none for gathers)"),
    ("root", "BIGINT", "root rank (-1: none)"),
    ("time_us", "DOUBLE", "average time per collective, us"),
    ("algbw_gbps", "DOUBLE", "algorithm bandwidth, GB/s (1e9 bytes/s)"),
    ("busbw_gbps", "DOUBLE", "bus bandwidth, GB/s"),
    ("in_place", "BOOLEAN", "the in-place half of the row"),
    ("nwrong", "BIGINT", "wrong elements (NULL: not validated)"),
    ("source_file", "VARCHAR", "the nccl-tests file (absolute path, as passed to --nccl-tests)"),
)

# nccl_inspector: NCCL Inspector plugin records (ingest/nccl.py), partitioned by the process's global rank.
NCCL_INSPECTOR_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("comm_hash", "VARCHAR", "communicator hash (header.id, \"0x...\")"),
    ("comm_rank", "BIGINT", "rank in the communicator"),
    ("n_ranks", "BIGINT", "ranks in the communicator"),
    ("nnodes", "BIGINT", "nodes of the communicator"),
    ("coll", "VARCHAR", "collective as NCCL names it (AllReduce, ...)"),
    ("op", "VARCHAR", "canonical op (all_reduce, ...)"),
    ("coll_sn", "BIGINT", "collective sequence number in the communicator"),
    ("msg_size_bytes", "BIGINT", "message size per rank (coll_msg_size_bytes)"),
    ("exec_time_us", "DOUBLE", "execution time, us (slowest kernel channel)"),
    ("timing_source", "VARCHAR", "kernel_gpu | kernel_cpu | collective_cpu"),
    ("algbw_gbps", "DOUBLE", "algbw the plugin computed, GB/s"),
    ("busbw_gbps", "DOUBLE", "busbw the plugin computed, GB/s"),
    ("coll_start_us", "BIGINT", "collective start, epoch us (verbose dumps only)"),
    ("kernel_start_us", "BIGINT", "first kernel channel start, epoch us (verbose dumps only)"),
    ("hostname", "VARCHAR", "host"),
    ("pid", "BIGINT", "process id"),
    ("dump_timestamp_us", "BIGINT", "when the record was written, epoch us"),
    ("source_file", "VARCHAR", "log file, relative to the trace directory"),
)

# run_manifest: the trace directory's run.json (ingest/run_manifest.py), one row under rank=-1 (no rank's).
# Replay reads hosts and the parallel layout from here (Store.run_manifest), never from the trace directory.
RUN_MANIFEST_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("manifest_version", "BIGINT", "run.json's tracekit_run_manifest format version (NULL when it names none)"),
    ("doc_json", "VARCHAR", "the whole run.json object as compact JSON: job shape, per-rank hosts, parallel layout, "
                            "measured step times"),
    ("source_file", "VARCHAR", "run.json, relative to the trace directory"),
)

NO_RANK = -1  # partition of a source that belongs to no rank (nccl-tests references, run.json); never in Store.ranks

# Tables written per source file; each file of a table lives under
# <store>/<table>/rank=<R>/<file-key>-<generation>.parquet
TABLES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "events": STORED_EVENT_COLUMNS,
    "gpu_args": GPU_ARG_COLUMNS,
    "comm_args": COMM_ARG_COLUMNS,
    "ranks": RANK_COLUMNS,
    "steps": STEP_COLUMNS,
    "flows": FLOW_COLUMNS,
    "memory": MEMORY_COLUMNS,
    "fr_entries": FR_COLUMNS,
    "nccl_tests": NCCL_TESTS_COLUMNS,
    "nccl_inspector": NCCL_INSPECTOR_COLUMNS,
    "run_manifest": RUN_MANIFEST_COLUMNS,
}
