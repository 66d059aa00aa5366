"""`[parallelism] dp` alone: a different data-parallel degree applied to a run's graph, each rank's batch kept
(any other [parallelism] key re-lays the whole run out: replay/relayout.py).

What it needs, and what it changes:

  dp   The current layout (run.json's `parallel` block that `tracekit record` / `demo-train` write, or
       process groups whose description names data parallelism) and a communication model calibrated
       from the run. The gradient collectives of the data-parallel group change group size (p -> p'),
       their ranks and hosts (one rank per host stays one rank per host); their transfer becomes
       measured x cost(p') / cost(p) under the calibrated alpha-beta model, before any network change
       of the scenario applies. Per-rank work is unchanged (weak scaling: the per-rank batch is kept,
       the global batch grows by p'/p); the new ranks behave like the measured ones (they are not
       replayed separately: ranks identical up to noise are folded).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.comms import process_group_configs
from tracekit.errors import TracekitError

_DP_DESCS = ("dp", "data_parallel", "data-parallel", "ddp", "default_pg", "world")


def layout(run) -> dict:
    """The run's parallel layout: {dp, tp, pp, micro_batches, global_batch_size, model_bytes,
    activation_bytes, layers, source}. From run.json's `parallel` block (as ingested into the store),
    else from the traces' distributedInfo when it shows a plain data-parallel job (one world size, and
    every process group the whole world): dp = world size, tp = pp = 1. {} when neither tells."""
    par = run.run_manifest().get("parallel") or {}
    if par.get("dp"):
        return {"dp": int(par["dp"]), "tp": int(par.get("tp", 1)), "pp": int(par.get("pp", 1)),
                "micro_batches": int(par.get("micro_batches", 1)), "global_batch_size": par.get("global_batch_size"),
                "model_bytes": par.get("model_bytes"), "activation_bytes": par.get("activation_bytes"),
                "layers": par.get("layers"), "source": "run.json"}
    return _from_distributed_info(run)


def _from_distributed_info(run) -> dict:
    rows = run.sql("SELECT DISTINCT world_size FROM ranks WHERE world_size IS NOT NULL")
    if len(rows) != 1:
        return {}
    world = int(rows.world_size.iloc[0])
    for groups, _ in process_group_configs(run):
        if any(isinstance(g, dict) and g.get("pg_size") not in (None, world) for g in groups):
            return {}  # other groups than the world's (tensor, pipeline, ...): the layout is not plain DP
    return {"dp": world, "tp": 1, "pp": 1, "micro_batches": 1, "global_batch_size": None, "model_bytes": None,
            "activation_bytes": None, "layers": None, "source": "distributedInfo"}


def apply_dp(colls: pd.DataFrame, new_dp: int, lay: dict, calibrated) -> tuple[pd.DataFrame, list[str]]:
    """The collectives (the graph's, or as a [topology] recounted them) with the data-parallel group
    resized to new_dp, transfers re-costed."""
    colls = colls.copy()
    if not lay:
        raise TracekitError("[parallelism] dp: the run's data-parallel degree is unknown: neither run.json's "
                            "'parallel' block (written by `tracekit record` / `demo-train`) nor the traces' "
                            "distributedInfo (one world size, every process group the world) tells it")
    dp = lay["dp"]
    if lay.get("tp", 1) != 1 or lay.get("pp", 1) != 1:
        dp_sel = colls.pg_name.astype(str).str.lower().isin(_DP_DESCS)
        if not dp_sel.any():
            raise TracekitError("[parallelism] dp: the run mixes parallelisms and no process group is named as the "
                                "data-parallel one; cannot tell the gradient collectives apart")
    else:
        dp_sel = colls.group_size.astype(int) == dp
    if not dp_sel.any():
        raise TracekitError(f"[parallelism] dp: no collective of the data-parallel group (size {dp}) in the trace")
    notes = []
    if new_dp == dp:
        return colls, notes
    if calibrated is None:
        raise TracekitError("[parallelism] dp: re-costing the gradient collectives needs a calibrated network "
                            "model ([network] calibrate = 'run' or 'nccl_tests')")
    old = colls[dp_sel].copy()
    new = old.copy()
    new["group_size"] = new_dp
    new["ranks"] = [list(range(new_dp)) for _ in range(len(new))]
    nh = old.n_hosts.astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    per_host = old.group_size.to_numpy(float) / np.where(np.isnan(nh) | (nh <= 0), 1.0, nh)
    new_hosts = np.where(np.isnan(nh), np.nan, np.maximum(1.0, np.ceil(new_dp / per_host)))
    new["n_hosts"] = pd.array(np.where(np.isnan(new_hosts), 0, new_hosts).astype(np.int64), dtype="Int64")
    new.loc[np.isnan(new_hosts), "n_hosts"] = pd.NA
    # the added (or removed) ranks arrive like the measured ones: the last arrival moves by the change of
    # the expected maximum of p vs p' arrivals drawn from the measured arrival offsets
    wait = expected_max_shift(old, dp, new_dp)
    c_old = calibrated.transfer_ns(old).astype(float)
    c_new = calibrated.transfer_ns(new).astype(float)
    ratio = np.where(c_old > 0, c_new / np.maximum(c_old, 1.0), 1.0)
    new["measured_transfer_ns"] = np.rint(old.measured_transfer_ns.to_numpy(float) * ratio).astype(np.int64)
    colls["dp_wait_shift_ns"] = 0
    colls.loc[dp_sel, "dp_wait_shift_ns"] = wait
    colls.loc[dp_sel, ["group_size", "n_hosts", "measured_transfer_ns"]] = new[["group_size", "n_hosts",
                                                                                  "measured_transfer_ns"]]
    colls.loc[dp_sel, "ranks"] = pd.Series(new["ranks"].tolist(), index=new.index, dtype=object)
    notes.append(f"data parallelism {dp} -> {new_dp}: {int(dp_sel.sum())} gradient collective(s) re-costed "
                 f"(median x{np.median(ratio):.3f}); last arrival moved by {wait / 1e6:+.2f} ms (expected maximum of "
                 f"{new_dp} vs {dp} arrivals drawn from the measured ones); per-rank batch kept (global batch "
                 f"x{new_dp / dp:g})")
    if lay.get("source") == "distributedInfo":
        notes.append(f"data-parallel degree {dp} from the traces' distributedInfo (no run.json): one process group "
                     "spanning the world, taken as plain data parallelism; per-rank compute unchanged")
    return colls, notes


def expected_max_shift(colls: pd.DataFrame, p: int, p_new: int) -> int:
    """E[max of p_new] - E[max of p] arrival offsets, offsets (arrival - the collective's mean arrival)
    pooled over the collectives with two or more participants; exact over their empirical distribution:
    E[max of k] = sum_i x_(i) ((i/n)^k - ((i-1)/n)^k)."""
    offs = []
    for arr in colls.get("arrivals", pd.Series([], dtype=object)):
        a = np.asarray(arr, np.float64)
        if len(a) >= 2:
            offs.append(a - a.mean())
    if not offs:
        return 0
    x = np.sort(np.concatenate(offs))
    n = len(x)
    i = np.arange(1, n + 1, dtype=np.float64)

    def emax(k):
        return float((x * ((i / n) ** k - ((i - 1) / n) ** k)).sum())

    return int(round(emax(p_new) - emax(p)))
