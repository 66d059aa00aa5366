"""Gradient collectives against the backward's compute, per rank and step (analyses/backward_collectives.sql)."""
from __future__ import annotations

from ._sql import check_scope, query, with_note


def backward_collectives(run, rank: int | None = None):
    """Per rank and step: the gradient all-reduce / reduce-scatter calls, how many came after the backward had
    computed every gradient, the backward's compute time and the gap to the first call."""
    check_scope(run, rank)
    df = query(run, "backward_collectives", rank=rank)
    return df if len(df) else with_note(df, "no step with autograd operators and gradient all-reduce / "
                                            "reduce-scatter calls in this scope")
