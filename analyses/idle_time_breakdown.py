"""Idle time per rank and stream: host wait / kernel wait / other (analyses/idle_time_breakdown.sql)."""
from __future__ import annotations

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def idle_time_breakdown(run, rank: int | None = None, step: int | None = None, *,
                        kernel_wait_threshold_ns: int = 30_000, drop_last_step: bool = False, rules=None):
    """Per (rank, stream): idle_ns split into host_wait_ns, kernel_wait_ns, other_idle_ns."""
    check_scope(run, rank, step)
    prepare(run, rules)
    df = query(run, "idle_time_breakdown", rank=rank, step=step, drop_last_step=drop_last_step,
               kernel_wait_threshold_ns=int(kernel_wait_threshold_ns))
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)
