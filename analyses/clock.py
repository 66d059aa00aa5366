"""Clock offsets per rank from matched collectives (analyses/clock_offsets.sql)."""
from __future__ import annotations

from tracekit.comms import prepare

from ._sql import query


def clock_offsets(run):
    """Per rank: the estimated correction to add to its times, collectives used, residual."""
    prepare(run, None)
    return query(run, "clock_offsets")


def estimate_offsets(run) -> dict[int, int]:
    df = clock_offsets(run)
    return {int(r): int(o) for r, o in zip(df["rank"], df["clock_offset_ns"])}
