"""Communication across ranks: the per-rank collectives table, its cross-rank matching, and clock
offsets estimated from matched collectives.

Owns the private SQL in collectives.sql (installed as TEMP objects on a run's connection); the public
analyses built on it live in analyses/comms.py, the CLI in tracekit/cli/comms.py.
"""
from __future__ import annotations

from pathlib import Path

from ..store.sql import statements

_SQL = Path(__file__).with_name("collectives.sql")


def _installed(run) -> bool:
    from ..errors import TracekitError

    try:
        run.sql("SELECT 1 FROM _comm_rows_raw LIMIT 0")
        return True
    except TracekitError:
        return False


def prepare(run, offsets: dict[int, int] | None = None) -> None:
    """Install the collectives views on run's connection (once), with per-rank clock offsets in ns added
    to every time (None: no correction beyond ranks.clock_offset_ns)."""
    run.sql("CREATE OR REPLACE TEMP TABLE _comm_clock_offsets (rank BIGINT, clock_offset_ns BIGINT)")
    if offsets:
        values = ", ".join(["(?, ?)"] * len(offsets))
        run.sql(f"INSERT INTO _comm_clock_offsets VALUES {values}",
                [v for r, o in sorted(offsets.items()) for v in (int(r), int(o))])
    if not _installed(run):
        for stmt in statements(_SQL.read_text(encoding="utf-8")):
            run.sql(stmt)
