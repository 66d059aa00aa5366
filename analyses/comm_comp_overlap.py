"""Communication-computation overlap and exposed communication (analyses/comm_comp_overlap.sql)."""
from __future__ import annotations

from ._sql import any_rank_without_gpu, check_scope, prepare, query


def comm_comp_overlap(run, rank: int | None = None, step: int | None = None, *, by_step: bool = False,
                      drop_last_step: bool = False, rules=None):
    """comm_ns, overlap_ns, overlap_pct and exposed_comm_ns per rank (or per step with by_step)."""
    check_scope(run, rank, step)
    prepare(run, rules)
    return query(run, "comm_comp_overlap", rank=rank, step=step, by_step=by_step or step is not None,
                 drop_last_step=drop_last_step, cpu_fallback=any_rank_without_gpu(run))
