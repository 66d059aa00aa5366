"""Compare what-if scenarios against the measured run: one graph, one replay per scenario.

A row per scenario (COLUMNS). The job's step time is its slowest rank's median step; exposed
communication is the time a rank spends in collectives while it has nothing else to run (its GPU
streams on a GPU rank, its busy CPU threads on a gloo rank), median per step, worst rank.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from analyses import depgraph as _graph

from .replayer import ReplayResult, replay

COLUMNS = {
    "scenario": "scenario name (file stem unless the file names it); 'measured' is the run itself",
    "measured_step_ns": "measured step time of the job: the slowest rank's median over steps, ns",
    "predicted_step_ns": "replayed step time under the scenario, same definition, ns",
    "change_pct": "100 * (predicted - measured) / measured",
    "throughput_steps_per_s": "1e9 / predicted_step_ns",
    "throughput_samples_per_s": "global batch (run.json; x dp'/dp under a data-parallel change) / step time",
    "measured_exposed_comm_ns": "measured exposed communication per step (worst rank's median), ns",
    "exposed_comm_ns": "predicted exposed communication per step (worst rank's median), ns",
    "reconfigurations": "optical circuit reconfigurations in the replayed steps (NULL: no [optical])",
    "goodput_pct": "useful time / wall time over the whole job under [failures] (NULL: none)",
    "effective_training_pct": "effective training time under [failures], Meta's definition (NULL: none)",
    "time_to_train_h": "expected wall time to the target steps under [failures] (NULL: none)",
    "out": "the re-timed run's store (with --out)",
}


def _union(s: np.ndarray, e: np.ndarray):
    if len(s) == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def _covered(us, ue, lo, hi) -> int:
    """Length of the union (us, ue) inside [lo, hi)."""
    a = np.clip(us, lo, hi)
    b = np.clip(ue, lo, hi)
    return int((b - a).clip(min=0).sum())


def exposed_comm(g, start, end, steps: pd.DataFrame, step_ts, step_end) -> pd.DataFrame:
    """Per rank and step: time in collectives not covered by other work, on the given schedule."""
    rows = []
    kind, rank = g.kind, g.rank
    comm = np.flatnonzero(kind == _graph.K["comm"])
    main_tracks = set(g.tracks.loc[g.tracks.main, "track"].astype(int))
    has_gpu = set(g.tracks.loc[g.tracks.is_gpu, "rank"].astype(int))
    for r in g.ranks:
        on = comm[rank[comm] == r]
        # the exit of a participant is the next node on its track (spliced right after it)
        ex = on + 1
        cs, ce = start[on], end[np.minimum(ex, len(end) - 1)]
        if r in has_gpu:
            busy = np.flatnonzero((rank == r) & (kind == _graph.K["gpu"]))
        else:
            busy = np.flatnonzero((rank == r) & np.isin(kind, (_graph.K["cpu"], _graph.K["runtime"]))
                                  & np.isin(g.track, list(main_tracks)))
        us, ue = _union(cs, ce)
        bs, be = _union(start[busy], end[busy])
        sel = steps["rank"].to_numpy() == r
        for lo, hi in zip(step_ts[sel], step_end[sel]):
            total = _covered(us, ue, lo, hi)
            # comm time overlapped by busy time: intersect the two unions inside the window
            both = 0
            if len(bs) and len(us):
                i = np.searchsorted(be, us, side="left")
                for k in range(len(us)):
                    j = i[k]
                    while j < len(bs) and bs[j] < ue[k]:
                        a, b = max(us[k], bs[j], lo), min(ue[k], be[j], hi)
                        if b > a:
                            both += b - a
                        j += 1
            rows.append({"rank": r, "exposed_comm_ns": total - both})
    return pd.DataFrame(rows, columns=["rank", "exposed_comm_ns"])


def _job_exposed(df: pd.DataFrame) -> int | None:
    if df.empty:
        return None
    return int(df.groupby("rank").exposed_comm_ns.median().max())


def _step_windows(res: ReplayResult, measured: bool):
    g = res.graph
    st = g.steps
    if res.folding is not None:  # a folded replay times its representatives only (they stand for the rest)
        st = st[st["rank"].isin(g.ranks)]
    if st.empty:
        return st, np.zeros(0, np.int64), np.zeros(0, np.int64)
    if measured:
        return st, st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64)
    ts, end = res._warp(st[["rank", "pid", "tid"]], st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64))
    return st, ts, end


def _job_step(summary: pd.DataFrame, col: str) -> int:
    return int(summary[col].max())


def whatif(run, scenarios, *, out_dir: str | None = None, fold="auto") -> pd.DataFrame:
    """One row per scenario (COLUMNS), the measured run first. fold as in replay.run (off with out_dir)."""
    from .scenario import Scenario, load_scenario

    scens = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    names = [s.name for s in scens]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        from tracekit.errors import TracekitError

        raise TracekitError(f"scenario name {dup[0]!r} given twice: name them apart (top-level `name = ...`)")
    g = _graph.build(run)
    fold = False if out_dir else fold
    base = replay(run, graph=g, fold=False)
    st, ts, end = _step_windows(base, measured=True)
    meas_exposed = _job_exposed(exposed_comm(g, g.start_ns, g.start_ns + g.dur_ns, st, ts, end))
    s0 = base.summary()
    measured = _job_step(s0, "measured_step_ns")
    par = run.run_manifest().get("parallel") or {}
    gbs = par.get("global_batch_size")
    rows = [{"scenario": "measured", "measured_step_ns": measured, "predicted_step_ns": measured, "change_pct": 0.0,
             "throughput_steps_per_s": 1e9 / measured if measured else None,
             "throughput_samples_per_s": gbs * 1e9 / measured if gbs and measured else None,
             "measured_exposed_comm_ns": meas_exposed, "exposed_comm_ns": meas_exposed}]
    results = []
    for sc in scens:
        res = replay(run, sc, graph=g, fold=fold)
        results.append(res)
        s = res.summary()
        pred = _job_step(s, "predicted_step_ns")
        st, ts, end = _step_windows(res, measured=False)
        # a folded replay's schedule is of the folded graph (res.graph), not of the full one
        exp = _job_exposed(exposed_comm(res.graph, res.start_ns, res.end_ns, st, ts, end))
        dp = sc.parallelism.dp
        scale = dp / par["dp"] if dp and par.get("dp") else 1.0
        row = {"scenario": sc.name, "measured_step_ns": measured, "predicted_step_ns": pred,
               "change_pct": 100.0 * (pred - measured) / measured if measured else None,
               "throughput_steps_per_s": 1e9 / pred if pred else None,
               "throughput_samples_per_s": gbs * scale * 1e9 / pred if gbs and pred else None,
               "measured_exposed_comm_ns": meas_exposed, "exposed_comm_ns": exp}
        if sc.optical is not None:
            row["reconfigurations"] = res.info.get("reconfigurations")
        if sc.failures is not None:
            world = int(run.sql("SELECT coalesce(max(world_size), count(*)) AS n FROM ranks").n.iloc[0])
            n_gpus = sc.failures.n_gpus or int(round(world * scale))
            gp = sc.failures.goodput(pred, n_gpus=n_gpus)
            row.update({"goodput_pct": 100.0 * gp.goodput, "effective_training_pct": gp.effective_training_time_pct,
                        "time_to_train_h": gp.time_to_train_s / 3600.0})
        if out_dir:
            row["out"] = res.write_store(os.path.join(out_dir, _safe(sc.name)))
        rows.append(row)
    df = pd.DataFrame(rows).reindex(columns=[c for c in COLUMNS if c != "out" or out_dir])
    df.attrs["notes"] = {r.scenario.name: list(r.notes) for r in results}  # plain data: attrs are deep-copied
    return df


def _safe(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._")
    return keep or "scenario"
