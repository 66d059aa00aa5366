"""Exposed communication per (rank, step): communication time not hidden behind compute
(analyses/exposed_comm.sql; the overlap arithmetic is analyses/_overlap.sql, shared with comm_comp_overlap), and
the per-rank figure every reader of it quotes (the what-if's measured and predicted columns, doctor, the report).
"""
from __future__ import annotations

import pandas as pd

from ._sql import check_scope, prepare, query, with_note
from .comms import prepare_views
from .steps import median_steps


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


PER_RANK_COLUMNS = {
    "rank": "global rank",
    "timeline": "gpu, cpu, or gpu+cpu: the timelines the rank's communication ran on",
    "steps": "steps in the medians (the rank's last step left out when it has others)",
    "exposed_comm_ns": "median exposed communication per step, ns",
    "overlap_ns": "median communication time per step with compute running, ns",
    "comm_ns": "median communication time per step, ns",
    "step_ns": "median step time, ns",
}


def exposed_comm_per_rank(df: pd.DataFrame) -> pd.DataFrame:
    """Per rank, from exposed_comm's rows: the medians over its steps (PER_RANK_COLUMNS); a step's timelines
    (GPU kernels, gloo collectives) add up. The job's figure is the worst rank's: exposed_comm_job_ns."""
    if not len(df):
        return pd.DataFrame(columns=list(PER_RANK_COLUMNS))
    per_step = df.groupby(["rank", "step"], as_index=False).agg(
        exposed_comm_ns=("exposed_comm_ns", "sum"), overlap_ns=("overlapped_ns", "sum"), comm_ns=("comm_ns", "sum"),
        step_ns=("step_ns", "first"), is_last=("is_last_step", "first"))
    timelines = df.groupby("rank").timeline.agg(lambda t: "+".join(sorted(set(t), reverse=True)))
    g = per_step[median_steps(per_step)].groupby("rank", sort=True)
    ranks = g.size().index
    return pd.DataFrame({"rank": ranks.astype(int), "timeline": timelines.reindex(ranks).to_numpy(),
                         "steps": g.size().to_numpy(),
                         "exposed_comm_ns": g.exposed_comm_ns.median().astype(float).to_numpy(),
                         "overlap_ns": g.overlap_ns.median().astype(float).to_numpy(),
                         "comm_ns": g.comm_ns.median().astype(float).to_numpy(),
                         "step_ns": g.step_ns.median().astype(float).to_numpy()}, columns=list(PER_RANK_COLUMNS))


def exposed_comm_job_ns(df: pd.DataFrame) -> int | None:
    """The job's exposed communication per step: its worst rank's median (exposed_comm_per_rank); None without
    communication rows."""
    per = exposed_comm_per_rank(df)
    return int(round(per.exposed_comm_ns.max())) if len(per) else None
