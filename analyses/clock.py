"""Clock offsets per rank from matched collectives (analyses/clock_offsets.sql)."""
from __future__ import annotations

from ._sql import query, with_note
from .comms import prepare_views


def clock_offsets(run):
    """Per rank: the estimated correction to add to its times, collectives used, residual."""
    prepare_views(run, None)
    df = query(run, "clock_offsets")
    if not len(df):
        with_note(df, "no collective matched across two or more ranks: no clock offset can be estimated")
    return df


def estimate_offsets(run) -> dict[int, int]:
    df = clock_offsets(run)
    return {int(r): int(o) for r, o in zip(df["rank"], df["clock_offset_ns"])}
