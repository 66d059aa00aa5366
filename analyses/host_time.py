"""Host time doctor weighs: data loading (analyses/data_loading.sql) and synchronising runtime calls
(analyses/sync_calls.sql, over the dependency graph's set of sync calls)."""
from __future__ import annotations

from ._sql import check_scope, query, with_note
from .depgraph.model import SYNC_CALLS

# The CPU operators and annotations that load data (DataLoader iteration, _next_data, data_loading / dataloader
# annotations): data_loading's union, and memory_breakdown's data-loading allocations (other, not activations).
DATA_LOADING_PATTERN = r"(?i)(data_?loading|dataloader|_next_data|enumerate\(DataLoader\))"


def data_loading(run, rank: int | None = None):
    """Per rank: the union of the CPU operators and annotations that load data, and its disjoint spans."""
    check_scope(run, rank)
    df = query(run, "data_loading", rank=rank, data_loading_pattern=DATA_LOADING_PATTERN)
    return df if len(df) else with_note(df, "no data-loading operators or annotations (DataLoader, _next_data, "
                                            "data_loading) in this scope")


def sync_calls(run, rank: int | None = None):
    """Per rank and call: the synchronising runtime calls (SYNC_CALLS) made and the time the host spent in them."""
    check_scope(run, rank)
    df = query(run, "sync_calls", rank=rank, sync_calls=sorted(SYNC_CALLS))
    return df if len(df) else with_note(df, "no synchronising runtime calls in this scope")
