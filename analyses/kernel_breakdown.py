"""GPU kernel breakdown per name / per class (analyses/kernel_breakdown.sql)."""
from __future__ import annotations

from tracekit.errors import TracekitError

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def kernel_breakdown(run, rank: int | None = None, step: int | None = None, *, top_k: int = 10,
                     by_class: bool = False, drop_last_step: bool = False, rules=None):
    """count / total / mean / p50 / p95 / max per kernel name (top_k per class plus "others") or per class."""
    if int(top_k) < 1:
        raise TracekitError(f"top_k {top_k}: must be at least 1")
    check_scope(run, rank, step)
    prepare(run, rules)
    df = query(run, "kernel_breakdown", rank=rank, step=step, drop_last_step=drop_last_step,
               top_k=int(top_k), by_class=bool(by_class))
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)
