"""Memory copy bandwidth, the allocator's timeline and peak, and what fills it (analyses/memory_*.sql; the
block attribution memory_breakdown and memory_category_timeline share is analyses/_memory_blocks.sql)."""
from __future__ import annotations

from tracekit.store.sql import statements

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, sql_text, with_note
from .host_time import DATA_LOADING_PATTERN

NO_MEMORY_EVENTS = "no [memory] events in this trace (profile with profile_memory=True)"
# the categories memory_breakdown and memory_category_timeline split the allocator's bytes into
# (analyses/_memory_blocks.sql's _mem_categories), in their order
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "communication_buffers", "other")


def memory_bandwidth(run, rank: int | None = None, step: int | None = None, *, drop_last_step: bool = False):
    """Summed memcpy/memset bandwidth in flight over time, per direction."""
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, "memory_bandwidth", rank=rank, step=step, drop_last_step=drop_last_step)
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)


def memory_bandwidth_summary(run, rank: int | None = None, step: int | None = None, *, drop_last_step: bool = False):
    """Copies, bytes, time and bandwidth per direction."""
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, "memory_bandwidth_summary", rank=rank, step=step, drop_last_step=drop_last_step)
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)


def _memory(name, run, rank):
    check_scope(run, rank)
    df = query(run, name, rank=rank)
    return df if len(df) else with_note(df, NO_MEMORY_EVENTS)


def _attributed(name, run, rank):
    """An analysis over the block attribution: the operators' helpers installed first (_cpu_op_is_comm, the
    argument shapes' macros)."""
    check_scope(run, rank)
    _shapes_macros(run)
    df = query(run, name, rank=rank, data_loading_pattern=DATA_LOADING_PATTERN)
    return df if len(df) else with_note(df, NO_MEMORY_EVENTS)


def memory_timeline(run, rank: int | None = None):
    """Allocated / reserved bytes after every allocation and free."""
    return _memory("memory_timeline", run, rank)


def memory_peak(run, rank: int | None = None):
    """Peak allocated / reserved bytes per rank and device."""
    return _memory("memory_peak", run, rank)


def memory_breakdown(run, rank: int | None = None):
    """Per rank, device and category, the bytes live at memory_peak's peak; the six categories add up to its
    peak_allocated_bytes. The note says where bytes allocated before profiling could not be split."""
    df = _attributed("memory_breakdown", run, rank)
    if len(df):
        unsplit = memory_model_state(run, rank).query("parameter_bytes.isna() and pre_profiling_bytes_at_peak > 0")
        if len(unsplit):
            with_note(df, "; ".join(
                f"rank {int(r.rank)}: {int(r.pre_profiling_bytes_at_peak):,} bytes allocated before profiling are in "
                "other: the trace records no parameter shapes to split them by (profile with record_shapes=True)"
                for r in unsplit.itertuples()))
    return df


def memory_model_state(run, rank: int | None = None):
    """Per rank, the parameter bytes the trace's shapes show and its optimizer: what splits the bytes allocated
    before profiling in memory_breakdown."""
    return _attributed("memory_model_state", run, rank)


def parameter_bytes(run, rank: int | None = None):
    """Per rank, the bytes of the parameters its optimizer updates, from the recorded shapes (no memory events
    needed): what memory_model_state splits pre-profiling bytes by, and what a re-layout re-shards."""
    check_scope(run, rank)
    _shapes_macros(run)
    df = query(run, "parameter_bytes", rank=rank)
    return df if len(df) else with_note(df, "no parameter shapes: neither an optimizer's update nor AccumulateGrad "
                                            "in the trace carries Input Dims (a training step profiled with "
                                            "record_shapes=True has them)")


def _shapes_macros(run) -> None:
    """The operators' helpers (_cpu_op_is_comm, ...) and the argument shapes' macros, on run's connection."""
    prepare(run)
    for stmt in statements(sql_text("_tensor_args")):
        run.sql(stmt)


def memory_limiting_devices(peaks):
    """memory_peak's rows for the memory a rank can run out of: its accelerators' (device_type other than CPU), or
    on a run without any (a CPU run standing in for a GPU job) the CPU's. The one rule the memory what-if and
    doctor's memory findings judge a rank by."""
    dev = peaks[peaks.device_type != 0]
    return dev if len(dev) else peaks[peaks.device_type == 0]


def memory_blocks(run, rank: int | None = None):
    """Every allocator block with its lifetime and category (memory_breakdown's attribution, block by block)."""
    return _attributed("memory_blocks", run, rank)


def memory_category_timeline(run, rank: int | None = None):
    """Per rank, device and category, the bytes live over time (memory_breakdown's attribution at every event)."""
    return _attributed("memory_category_timeline", run, rank)
