"""The list of analyses: name -> function and one-line description, for the CLI,
Run.analyze and the report. Add an analysis here and it is listed everywhere."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

from tracekit.errors import TracekitError


@dataclass(frozen=True)
class Analysis:
    name: str
    module: str  # analyses.<module> holds a function of the same name
    description: str
    needs_other_run: bool = False  # trace_diff compares two runs
    sql: str = ""  # the .sql file documenting the columns, when not named like the analysis
    columns_attr: str = "COLUMNS"  # Python-only analyses: the module's table of documented columns

    @property
    def sql_name(self) -> str:
        return self.sql or self.name

    @property
    def columns(self) -> dict[str, str]:
        """Documented output columns: the .sql file's @column lines, or the module's COLUMNS."""
        from ._sql import documented_columns

        try:
            return documented_columns(self.sql_name)
        except FileNotFoundError:
            return dict(getattr(importlib.import_module(f"analyses.{self.module}"), self.columns_attr, {}))

    @property
    def func(self) -> Callable:
        return getattr(importlib.import_module(f"analyses.{self.module}"), self.name)

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return {k: p for k, p in list(inspect.signature(self.func).parameters.items())[1:] if k not in PYTHON_ONLY}


# parameters a Python caller passes and a command line cannot: a prebuilt input (doctor builds the FLOPs op
# table once and hands it to mfu and roofline)
PYTHON_ONLY = frozenset({"ops"})

_ANALYSES = (
    Analysis("temporal_breakdown", "temporal_breakdown", "idle / compute / non-compute time per rank or step"),
    Analysis("kernel_classification", "kernel_classification", "class (communication/memory/compute/other) of every GPU op name"),
    Analysis("comm_comp_overlap", "comm_comp_overlap", "communication hidden under compute, and exposed communication"),
    Analysis("exposed_comm", "exposed_comm", "communication not hidden behind compute, per rank and step (GPU or gloo)"),
    Analysis("idle_time_breakdown", "idle_time_breakdown", "idle time per stream: host wait / kernel wait / other"),
    Analysis("kernel_breakdown", "kernel_breakdown", "count / total / mean / p50 / p95 / max per kernel name or class"),
    Analysis("kernel_launch_stats", "kernel_launch", "launch delay and runtime-call duration per launch call"),
    Analysis("kernel_launch_outliers", "kernel_launch", "GPU ops with a long launch delay, long call or short op"),
    Analysis("queue_length", "queue_length", "launch queue length per stream over time"),
    Analysis("queue_length_summary", "queue_length", "queue length per stream summarised; time on a full queue"),
    Analysis("memory_bandwidth", "memory", "memcpy/memset bandwidth over time by direction"),
    Analysis("memory_bandwidth_summary", "memory", "memcpy/memset bytes, time and bandwidth by direction"),
    Analysis("memory_timeline", "memory", "allocated / reserved bytes over time from [memory] events"),
    Analysis("memory_peak", "memory", "peak allocated / reserved bytes per device"),
    Analysis("memory_breakdown", "memory", "bytes at the memory peak by category: parameters, gradients, optimizer "
                                           "state, activations, communication buffers, other"),
    Analysis("memory_model_state", "memory", "parameter bytes from the recorded shapes and the optimizer per rank: "
                                             "what splits memory_breakdown's bytes allocated before profiling"),
    Analysis("parameter_bytes", "memory", "bytes of the parameters each rank's optimizer updates, from the recorded "
                                          "shapes (no memory events needed)"),
    Analysis("memory_blocks", "memory", "every allocator block: allocated, ended, bytes and category "
                                        "(memory_breakdown's attribution, block by block)"),
    Analysis("memory_category_timeline", "memory", "bytes of each memory category over time (memory_breakdown's "
                                                   "attribution at every allocation and free)"),
    Analysis("gpu_time_by_annotation", "attribution", "GPU time per innermost gpu_user_annotation"),
    Analysis("gpu_time_by_cpu_op", "attribution", "GPU time per launching CPU op (innermost and top-level)"),
    Analysis("kernel_sequences", "attribution", "most frequent kernel sequences under an operator"),
    Analysis("critical_path", "critical_path", "critical path of one step on one rank, segment by segment"),
    Analysis("critical_path_summary", "critical_path", "share of the critical path: CPU, launch, compute, comm, memory",
             columns_attr="SUMMARY_COLUMNS"),
    Analysis("flops_by_op", "flops", "FLOPs and bytes per leaf operator, achieved TFLOP/s and GB/s of its kernels",
             columns_attr="FLOPS_BY_OP_COLUMNS"),
    Analysis("mfu", "flops", "model FLOPs per step, achieved TFLOP/s and MFU against the device catalog's peak",
             columns_attr="MFU_COLUMNS"),
    Analysis("roofline", "flops", "arithmetic intensity, achieved rate, bound and share of the roofline per op class",
             columns_attr="ROOFLINE_COLUMNS"),
    Analysis("collectives", "comms", "one row per (rank, collective): group, op, bytes, call, kernel, match key, wait"),
    Analysis("collectives_matched", "comms", "collectives matched across ranks: skew, transfer, algbw/busbw, missing ranks"),
    Analysis("straggler_attribution", "comms", "which rank arrives last at collectives, by how much, waiting caused"),
    Analysis("bandwidth_report", "comms", "busbw per process group, op and message-size bucket"),
    Analysis("clock_offsets", "comms", "per-rank clock offsets estimated from matched collectives"),
    Analysis("comms_check", "comms", "flight recorder: collectives not joined by all ranks, mismatches"),
    Analysis("comms_last_completed", "comms", "flight recorder: last collective each rank enqueued/started/completed"),
    Analysis("data_loading", "host_time", "host time in data loading per rank (DataLoader, _next_data), nested spans once"),
    Analysis("sync_calls", "host_time", "synchronising runtime calls per rank and name: calls and time blocked"),
    Analysis("small_kernels", "small_kernels", "kernels shorter than max_ns (10 us) per rank: count and time"),
    Analysis("compute_per_step", "compute_per_step", "union of compute per rank and step (kernels, else CPU ops)"),
    Analysis("backward_collectives", "backward_collectives",
             "gradient all-reduce / reduce-scatter calls issued during vs after the backward's compute, per step"),
    Analysis("trace_diff", "trace_diff", "ops and kernels added, removed, slower, faster against --against",
             needs_other_run=True),
)

REGISTRY: dict[str, Analysis] = {a.name: a for a in _ANALYSES}


def get(name: str) -> Analysis:
    try:
        return REGISTRY[name]
    except KeyError:
        raise TracekitError(f"NAME {name!r}: no such analysis; `tracekit analyze --list` shows them "
                            f"({', '.join(REGISTRY)})") from None


def check_params(name: str, params, spell: Callable[[str], str] = str) -> Analysis:
    """Analysis NAME, once every key of params is one of its parameters: an unknown one is the user's error,
    named as spell(key) writes it (the CLI: the option that gave it)."""
    a = get(name)
    accepted = a.parameters
    unknown = [k for k in params if k not in accepted]
    if unknown:
        raise TracekitError(f"{name}: unknown parameter(s) {', '.join(spell(k) for k in unknown)}; it takes "
                            f"{', '.join(accepted) or 'no parameters'}")
    return a


def run_analysis(run, name: str, *, executor=None, **params):
    """Call analysis NAME on run with params; unknown parameters are the user's error. A per-rank analysis of a
    run with more events than a chunk runs chunk by chunk (analyses/per_rank.py: memory bounded by a chunk), on the
    Dask cluster of `executor` ('dask://HOST:PORT') when given."""
    a = check_params(name, params)
    from .per_rank import PER_RANK, run_per_rank

    if name in PER_RANK and hasattr(run, "subset"):
        return run_per_rank(run, name, params, executor=executor)
    return a.func(run, **params)
