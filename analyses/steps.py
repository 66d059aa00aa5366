"""Which steps a rank's per-step medians are over (exposed_comm's per-rank figures, MFU, a replay's summary)."""
from __future__ import annotations

import pandas as pd


def median_steps(df: pd.DataFrame, rank: str = "rank", is_last: str = "is_last") -> pd.Series:
    """A mask of df's step rows: every step of a rank but its last, where the rank has others (the last often
    holds the profiler's teardown); a rank with only its last step keeps it. One pass over the rows: a filter per
    rank took seconds at 16,384 ranks."""
    kept = ~df[is_last].astype(bool)
    return kept | ~kept.groupby(df[rank]).transform("any")
