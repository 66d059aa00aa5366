"""Temporal breakdown per rank / per step: analyses/temporal_breakdown.sql gives the ops and documents the columns;
the unions are analyses/intervals.py's."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ._sql import any_rank_without_gpu, check_scope, documented_columns, named_params, prepare, sql_text
from .intervals import GroupedIntervals

_TIMELINES = ("cpu", "gpu")  # the output's order within a (rank, step)
_EMPTY = {"timeline": object, "idle_pct": np.float64, "compute_pct": np.float64,
          "non_compute_pct": np.float64}


def temporal_breakdown(run, rank: int | None = None, step: int | None = None, *, by_step: bool = False,
                       drop_last_step: bool = False, rules=None):
    """Idle / compute / non-compute ns and % of the kernel span, per rank (or per step with by_step).

    drop_last_step=True reproduces HolisticTraceAnalysis's scope (last step and unlaunched ops dropped);
    rules prepends kernel classification rules (see analyses.kernel_classes).
    """
    check_scope(run, rank, step)
    prepare(run, rules)
    text = sql_text("temporal_breakdown")
    params = dict(rank=rank, step=step, by_step=by_step or step is not None, drop_last_step=drop_last_step,
                  cpu_fallback=any_rank_without_gpu(run))
    ops = run.arrow(text, named_params(text, params, "temporal_breakdown.sql"))
    return breakdown(ops)


def breakdown(ops) -> pd.DataFrame:
    """The documented columns from the ops (a pyarrow table: on_gpu, rank, step, ts_ns, end_ns, is_compute), one
    row per (rank, step, timeline), in that order (step NULL first)."""
    columns = list(documented_columns("temporal_breakdown"))
    n = ops.num_rows
    if not n:
        return pd.DataFrame({c: pd.Series([], dtype=_EMPTY.get(c, np.int64)) for c in columns})
    def column(name, fill=None):
        c = ops.column(name)
        return (c if fill is None else c.fill_null(fill)).to_numpy(zero_copy_only=False)

    # a group is a (rank, step, timeline), numbered in the output's order: ((rank, step) x 2 + timeline)
    rank = column("rank")
    has_step = ops.column("step").null_count < n
    r0 = int(rank.min())
    key = rank - r0
    if has_step:
        step = column("step", -1)
        s0 = int(step.min())
        n_steps = int(step.max()) - s0 + 1
        key *= n_steps
        key += step
        key -= s0
        del step
    key *= len(_TIMELINES)
    key += column("on_gpu")  # _TIMELINES' place
    del rank
    iv = GroupedIntervals(key, column("ts_ns"), column("end_ns"))
    del key
    busy, compute_ns = iv.union_ns(), iv.union_ns(column("is_compute"))
    span = iv.last_end - iv.first_start
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 / np.where(span == 0, np.nan, span)
    rank_step, tl = np.divmod(iv.groups, len(_TIMELINES))
    df = pd.DataFrame({
        "rank": rank_step // n_steps + r0 if has_step else rank_step + r0,
        "step": rank_step % n_steps + s0 if has_step else pd.array([None] * len(tl), dtype="Int64"),  # DuckDB's
        "timeline": pd.Series(np.asarray(_TIMELINES, dtype=object)[tl], dtype=str),
        "op_count": iv.count,
        "start_ns": iv.first_start, "end_ns": iv.last_end, "kernel_span_ns": span, "busy_ns": busy,
        "idle_ns": span - busy, "compute_ns": compute_ns, "non_compute_ns": busy - compute_ns,
        "idle_pct": (span - busy) * pct, "compute_pct": compute_ns * pct, "non_compute_pct": (busy - compute_ns) * pct,
    }, columns=columns)
    return df
