"""Compare what-if scenarios against the measured run: one graph, one replay per scenario.

A row per scenario (COLUMNS). The job's step time is its slowest rank's median step; exposed
communication is the exposed_comm analysis's (analyses/exposed_comm.sql: the one definition), on the measured
run and on each replayed one (written as a store), its worst rank's median per step.
"""
from __future__ import annotations

import os

import pandas as pd

from analyses import depgraph as _graph

from . import memory
from .replayer import ReplayResult, folds, replay

COLUMNS = {
    "scenario": "scenario name (file stem unless the file names it); 'measured' is the run itself",
    "measured_step_ns": "measured step time of the job: the slowest rank's median over steps, ns",
    "predicted_step_ns": "replayed step time under the scenario, same definition, ns",
    "change_pct": "100 * (predicted - measured) / measured",
    "throughput_steps_per_s": "1e9 / predicted_step_ns",
    "throughput_samples_per_s": "global batch (run.json; x dp'/dp under `[parallelism] dp` alone, kept by a re-layout; "
                                "x [batch] scale) / step time",
    "measured_exposed_comm_ns": "exposed communication per step of the measured run (the exposed_comm analysis; "
                                "worst rank's median), ns",
    "exposed_comm_ns": "the same analysis on the replayed run, ns (a folded replay: its representative ranks')",
    "measured_peak_alloc_bytes": "the largest rank's measured peak of allocated memory (its device with the largest "
                                 "peak), bytes (NULL: the trace has no [memory] events)",
    "predicted_peak_alloc_bytes": "the largest rank's peak of allocated memory under the scenario (its device with the "
                                  "largest measured peak; the measured row: the measured peak), bytes (NULL: the "
                                  "trace has no [memory] events)",
    "device_memory_bytes": "that rank's device memory capacity ([hardware] gpu's, else the trace's or the catalog's "
                           "for its device), bytes (NULL: unknown)",
    "fits": "whether every rank's predicted peak leaves [memory] reserve_pct of its device free (NULL: capacity "
            "unknown)",
    "reconfigurations": "optical circuit reconfigurations in the replayed steps (NULL: no [optical])",
    "goodput_pct": "useful time / wall time over the whole job under [failures] (NULL: none)",
    "effective_training_pct": "effective training time under [failures], Meta's definition (NULL: none)",
    "time_to_train_h": "expected wall time to the target steps under [failures] (NULL: none)",
    "out": "the re-timed run's store (with --out)",
}


def _exposed_ns(run, ranks=None, executor=None) -> int | None:
    """The job's exposed communication per step, as the exposed_comm analysis gives it on this run (measured or
    replayed: a replayed run is a store like a measured one); ranks: only these; executor: run_analysis's."""
    from analyses.exposed_comm import exposed_comm_job_ns
    from analyses.registry import run_analysis

    # chunked on a big run, kept in the store's cache (analyses/per_rank.py)
    df = run_analysis(run, "exposed_comm", executor=executor)
    return exposed_comm_job_ns(df if ranks is None else df[df["rank"].isin(ranks)])


def _predicted_exposed_ns(res: ReplayResult, out: str | None):
    """exposed_comm on the replayed run, written as a store (into `out`, else a scratch folder): the analysis's
    one definition, on the predicted times. A folded replay writes its representatives' events (a folded rank is
    timed as its representative) and the figure is theirs."""
    import tempfile

    import tracekit

    reps = None if res.folding is None else list(res.graph.ranks)
    if out is not None:
        with tracekit.open(res.write_store(out)) as replayed:
            return _exposed_ns(replayed)
    with tempfile.TemporaryDirectory(prefix="tracekit-whatif-") as tmp:
        with tracekit.open(res.write_store(os.path.join(tmp, "replayed"), representatives=True)) as replayed:
            return _exposed_ns(replayed, reps)


def _job_step(summary: pd.DataFrame, col: str) -> int:
    return int(summary[col].max())


def whatif(run, scenarios, *, out_dir: str | None = None, fold="auto", executor=None) -> pd.DataFrame:
    """One row per scenario (COLUMNS), the measured run first. fold as in replay.run (off with out_dir). executor:
    'dask://HOST:PORT' runs the passes over every rank's events (the graph's pass that plans the folding, the
    measured exposed communication) in chunks of ranks on that Dask cluster; None: in this process."""
    from .scenario import Scenario, load_scenario

    scens = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    names = [s.name for s in scens]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        from tracekit.errors import TracekitError

        raise TracekitError(f"scenario name {dup[0]!r} given twice: name them apart (top-level `name = ...`)")
    fold = False if out_dir else fold
    has_memory = memory.has_memory_events(run)
    # a run that folds is replayed from its representatives' graph alone (replay/fold.py), the measured figures are
    # the store's; the memory columns read every rank's graph
    fold_first = folds(run, fold)
    folded_late = fold_first and has_memory
    from tracekit.ingest.executor import as_executor

    executor = as_executor(executor)  # a bad spec fails before any work
    wide = _graph.run_wide(run, executor=executor) if fold_first and not folded_late else None
    g = _graph.build(run) if wide is None else None
    base = replay(run, graph=g, fold=False) if wide is None else replay(run, fold=fold, wide=wide)
    meas_exposed = _exposed_ns(run, executor=executor)
    s0 = base.summary()
    measured = _job_step(s0, "measured_step_ns")
    par = run.run_manifest().get("parallel") or {}
    gbs = par.get("global_batch_size")
    rows = [{"scenario": "measured", "measured_step_ns": measured, "predicted_step_ns": measured, "change_pct": 0.0,
             "throughput_steps_per_s": 1e9 / measured if measured else None,
             "throughput_samples_per_s": gbs * 1e9 / measured if gbs and measured else None,
             "measured_exposed_comm_ns": meas_exposed, "exposed_comm_ns": meas_exposed,
             **_memory_columns(run, g, None, None, has_memory)}]
    rows[0].pop("_notes", None)  # a note on the measured peak is doctor's (oom_risk), not a scenario's
    results = []
    for sc in scens:
        res = replay(run, sc, graph=g, fold=fold, wide=wide)
        results.append(res)
        s = res.summary()
        pred = _job_step(s, "predicted_step_ns")
        out = os.path.join(out_dir, _safe(sc.name)) if out_dir else None
        exp = _predicted_exposed_ns(res, out)
        dp = sc.parallelism.dp
        # dp alone keeps each rank's batch (the global batch grows with it); a re-layout keeps the global batch
        grows = dp and par.get("dp") and not sc.parallelism.relayout
        scale = (dp / par["dp"] if grows else 1.0) * sc.batch.scale
        row = {"scenario": sc.name, "measured_step_ns": measured, "predicted_step_ns": pred,
               "change_pct": 100.0 * (pred - measured) / measured if measured else None,
               "throughput_steps_per_s": 1e9 / pred if pred else None,
               "throughput_samples_per_s": gbs * scale * 1e9 / pred if gbs and pred else None,
               "measured_exposed_comm_ns": meas_exposed, "exposed_comm_ns": exp,
               **_memory_columns(run, g, sc, res, has_memory)}
        res.notes.extend(row.pop("_notes", []))
        if folded_late and res.folding is not None:
            res.notes.append("the run has [memory] events, whose peaks read every rank's graph: it was built in full "
                             "and folded after")
        if sc.optical is not None:
            row["reconfigurations"] = res.info.reconfigurations
        if sc.failures is not None:
            world = int(run.sql("SELECT coalesce(max(world_size), count(*)) AS n FROM ranks").n.iloc[0])
            plan = res.info.relayout
            n_gpus = sc.failures.n_gpus or (plan.new.world if plan is not None else int(round(world * scale)))
            gp = sc.failures.goodput(pred, n_gpus=n_gpus)
            row.update({"goodput_pct": 100.0 * gp.goodput, "effective_training_pct": gp.effective_training_time_pct,
                        "time_to_train_h": gp.time_to_train_s / 3600.0})
        if out_dir:
            row["out"] = out
        rows.append(row)
    df = pd.DataFrame(rows).reindex(columns=[c for c in COLUMNS if c != "out" or out_dir])
    df.attrs["notes"] = {r.scenario.name: list(r.notes) for r in results}  # plain data: attrs are deep-copied
    return df


def _memory_columns(run, g, sc, res, has_memory: bool) -> dict:
    """predicted_peak_alloc_bytes, device_memory_bytes and fits (COLUMNS) for one row; sc None: the measured run;
    has_memory: whether the run has [memory] events (all NULL without)."""
    from analyses.devices import fit_verdict, memory_capacities

    from .specs import Scenario

    empty = {"measured_peak_alloc_bytes": None, "predicted_peak_alloc_bytes": None, "device_memory_bytes": None,
             "fits": None}
    if not has_memory:
        if sc is not None and sc.parallelism.relayout:
            return {**empty, "_notes": [f"{sc.where}: the trace has no [memory] events (profile_memory=True): the new "
                                        "layout's peak is not predicted"]}
        return empty
    sc = sc or Scenario()
    facts = res.info.memory if res is not None else None
    if facts is not None and res.graph is not g:  # a folded replay's facts are its representatives' graph's
        facts = memory.op_facts(run, g)
    plan = res.info.relayout if res is not None else None
    if plan is not None:  # a new layout: its state and activations re-sized (replay/relayout.py)
        from .relayout import predict_peak

        peaks = predict_peak(run, plan, facts.analyses if facts is not None else {})
    else:
        peaks = memory.predict_peak(run, g, facts, sc)
    if not len(peaks):
        return empty
    hw = sc.hardware
    caps = memory_capacities(run, list(zip(peaks["rank"], peaks.device_id)), device=hw.gpu, devices=hw.catalog)
    rows = []  # per rank: (verdict, predicted peak, capacity)
    notes = []
    for r, di, pred in zip(peaks["rank"], peaks.device_id, peaks.predicted_peak_alloc_bytes):
        cap = caps.get((r, di), (None, None))[0]
        ok, note = fit_verdict(pred, cap, sc.memory.reserve_pct)
        rows.append((ok, pred, cap))
        if note:
            notes.append(f"{sc.where}: rank {r}: {note}")
    # the rank the job is judged by: one that does not fit, else the fullest device, else the largest peak
    ok, pred, cap = max(rows, key=lambda x: (x[0] is False, x[1] / x[2] if x[2] else 0.0, x[1]))
    fits = None if any(v is None for v, _, _ in rows) else all(v for v, _, _ in rows)
    return {"measured_peak_alloc_bytes": int(peaks.measured_peak_alloc_bytes.max()),
            "predicted_peak_alloc_bytes": int(pred), "device_memory_bytes": cap, "fits": fits, "_notes": notes[:3]}


def _safe(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._")
    return keep or "scenario"
