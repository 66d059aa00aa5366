"""Temporal breakdown per rank / per step (analyses/temporal_breakdown.sql)."""
from __future__ import annotations

from ._sql import any_rank_without_gpu, check_scope, prepare, query


def temporal_breakdown(run, rank: int | None = None, step: int | None = None, *, by_step: bool = False,
                       drop_last_step: bool = False, rules=None):
    """Idle / compute / non-compute ns and % of the kernel span, per rank (or per step with by_step).

    drop_last_step=True reproduces HolisticTraceAnalysis's scope (last step and unlaunched ops dropped);
    rules prepends kernel classification rules (see analyses.kernel_classes).
    """
    check_scope(run, rank, step)
    prepare(run, rules)
    return query(run, "temporal_breakdown", rank=rank, step=step, by_step=by_step or step is not None,
                 drop_last_step=drop_last_step, cpu_fallback=any_rank_without_gpu(run))
