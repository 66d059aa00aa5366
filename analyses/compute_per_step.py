"""Compute per rank and step: the union of its compute kernels, else of its CPU operators outside collective
calls (analyses/compute_per_step.sql)."""
from __future__ import annotations

from ._sql import check_scope, query, with_note
from .kernel_classes import COMM_KERNEL_PATTERN


def compute_per_step(run, rank: int | None = None):
    """Per rank and profiled step (the last left out): the length of the union of its compute, ns."""
    check_scope(run, rank)
    df = query(run, "compute_per_step", rank=rank, comm_kernel_pattern=COMM_KERNEL_PATTERN)
    return df if len(df) else with_note(df, "no profiled steps (ProfilerStep#N) with compute in this scope")
