"""Launch queue length per stream over time and its summary (analyses/queue_length*.sql)."""
from __future__ import annotations

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def queue_length(run, rank: int | None = None, step: int | None = None, *, drop_last_step: bool = False):
    """Queue length per (rank, stream) at every launch and op start."""
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, "queue_length", rank=rank, step=step, drop_last_step=drop_last_step)
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)


def queue_length_summary(run, rank: int | None = None, step: int | None = None, *, queue_limit: int = 1024,
                         drop_last_step: bool = False):
    """Mean / p50 / p95 / max queue length per stream and the time at or above queue_limit."""
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, "queue_length_summary", rank=rank, step=step, drop_last_step=drop_last_step,
               queue_limit=int(queue_limit))
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)
