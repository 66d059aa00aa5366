"""Short kernels per rank (analyses/small_kernels.sql)."""
from __future__ import annotations

from tracekit.errors import TracekitError

from ._sql import check_scope, query, with_note

SMALL_KERNEL_NS = 10_000  # a kernel shorter than this is launch-bound on every current GPU


def small_kernels(run, rank: int | None = None, *, max_ns: int = SMALL_KERNEL_NS):
    """Per rank: kernels, those shorter than max_ns, and the time each takes."""
    if int(max_ns) < 1:
        raise TracekitError(f"max_ns {max_ns}: must be at least 1")
    check_scope(run, rank)
    df = query(run, "small_kernels", rank=rank, max_ns=int(max_ns))
    return df if len(df) else with_note(df, "no kernels in this scope")
