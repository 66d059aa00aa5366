"""Trace diff: which CPU ops and GPU ops were added, removed, got slower or faster between two runs.

Both sides are aggregated by SQL (analyses/_op_totals.sql) on their own store; the join is done here
because the two runs live in two stores. A measured and a replayed run compare the same way.
"""
from __future__ import annotations

from ._sql import check_scope, query

COLUMNS = {
    "kind": "cpu_op | gpu_op",
    "name": "operator or GPU op name",
    "status": "added | removed | slower | faster | same (mean change within threshold_pct)",
    "base_count": "occurrences in the base run",
    "other_count": "occurrences in the other run",
    "count_delta": "other_count - base_count",
    "base_total_ns": "summed duration in the base run, ns",
    "other_total_ns": "summed duration in the other run, ns",
    "total_delta_ns": "other_total_ns - base_total_ns, ns",
    "base_mean_ns": "mean duration in the base run, ns",
    "other_mean_ns": "mean duration in the other run, ns",
    "mean_change_pct": "(other_mean_ns - base_mean_ns) / base_mean_ns, percent",
}


def trace_diff(run, other=None, rank: int | None = None, step: int | None = None, *, threshold_pct: float = 5.0):
    """Compare run (base) with other per (kind, name); largest absolute time change first."""
    import numpy as np
    import pandas as pd

    from tracekit.errors import TracekitError

    if other is None:
        raise TracekitError("--against: trace_diff needs the other run to compare with")
    sides = []
    for r in (run, other):
        check_scope(r, rank, step)
        sides.append(query(r, "_op_totals", rank=rank, step=step))
    df = sides[0].merge(sides[1], on=["kind", "name"], how="outer", suffixes=("_base", "_other"))
    out = pd.DataFrame({"kind": df.kind, "name": df.name})
    out["base_count"] = df.n_base.fillna(0).astype("int64")
    out["other_count"] = df.n_other.fillna(0).astype("int64")
    out["count_delta"] = out.other_count - out.base_count
    out["base_total_ns"] = df.total_ns_base.fillna(0).astype("int64")
    out["other_total_ns"] = df.total_ns_other.fillna(0).astype("int64")
    out["total_delta_ns"] = out.other_total_ns - out.base_total_ns
    out["base_mean_ns"] = out.base_total_ns / out.base_count.replace(0, np.nan)
    out["other_mean_ns"] = out.other_total_ns / out.other_count.replace(0, np.nan)
    out["mean_change_pct"] = 100.0 * (out.other_mean_ns - out.base_mean_ns) / out.base_mean_ns.replace(0, np.nan)
    status = np.select(
        [out.base_count == 0, out.other_count == 0, out.mean_change_pct > threshold_pct,
         out.mean_change_pct < -threshold_pct],
        ["added", "removed", "slower", "faster"], default="same")
    out.insert(2, "status", status)
    order = out.total_delta_ns.abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)[list(COLUMNS)]
