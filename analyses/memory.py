"""Memory copy bandwidth and allocator timeline (analyses/memory_*.sql)."""
from __future__ import annotations

from ._sql import check_scope, has_gpu_ops, prepare, query, with_note, NO_GPU


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
    return df if len(df) else with_note(df, "no [memory] events in this trace (profile with profile_memory=True)")


def memory_timeline(run, rank: int | None = None):
    """Allocated / reserved bytes after every allocation and free."""
    return _memory("memory_timeline", run, rank)


def memory_peak(run, rank: int | None = None):
    """Peak allocated / reserved bytes per rank and device."""
    return _memory("memory_peak", run, rank)
