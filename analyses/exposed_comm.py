"""Exposed communication per (rank, step): communication time not hidden behind compute
(analyses/exposed_comm.sql; the overlap arithmetic is analyses/_overlap.sql, shared with comm_comp_overlap)."""
from __future__ import annotations

from ._sql import check_scope, prepare, query, with_note
from .comms import prepare_views


def exposed_comm(run, rank: int | None = None, step: int | None = None, *, rules=None):
    """comm_ns, overlapped_ns, exposed_comm_ns, exposed_pct and exposed_step_pct per (rank, step); GPU ranks
    from kernels (as comm_comp_overlap(by_step=True)), gloo ranks from collectives and the calling thread."""
    check_scope(run, rank, step)
    prepare(run, rules)
    # gloo collectives come from the collectives views; raw trace clocks are used, so no offsets
    prepare_views(run)
    df = query(run, "exposed_comm", rank=rank, step=step)
    if not len(df):
        with_note(df, "no steps with GPU kernels or gloo collectives in this scope")
    return df
