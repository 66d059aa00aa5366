"""tracekit doctor: what slows this job, ranked, each finding with its evidence, its fix and the replay's
predicted saving.

    import tracekit
    run = tracekit.open("runs/job42/")
    for f in tracekit.doctor(run):
        print(f["kind"], f["title"], f["saving_pct"])

Each detector (tracekit/advice/findings.py) reads the analyses for its evidence and writes the scenario
that models its fix; every scenario is replayed through `replay.whatif.whatif`, the function behind
`tracekit whatif`, so `tracekit whatif TRACE_DIR <its scenario>` gives the same predicted_step_ns. A fix
the replay cannot model has predicted_step_ns, saving_ns and saving_pct null ("not predicted"). The app
layer: it reads the analyses and the replay, neither reads it.
"""
from __future__ import annotations

import os

from .findings import DETECTORS, Candidate
from .toml import dumps as scenario_toml

FIELDS = {
    "kind": "straggler | exposed_communication | host_bound | data_loading | sync_stalls | small_kernels | "
            "oom_risk | memory_headroom | low_mfu | pipeline_imbalance",
    "rank": "the rank it is about; null when job-wide",
    "title": "one line",
    "evidence": "list of {analysis, figure}: the analyses' figures that show it",
    "fix": "what to change, in words",
    "scenario": "the what-if (TOML) that models the fix; null when the replay cannot model it",
    "measured_step_ns": "the job's measured step: the slowest rank's median, ns",
    "predicted_step_ns": "the replay's step under the scenario, same definition; null: not predicted",
    "saving_ns": "measured - predicted; null: not predicted",
    "saving_pct": "100 * saving / measured; null: not predicted",
    "confidence": "high | medium | low",
    "assumptions": "what the prediction takes as given",
}


def doctor(run, *, out_dir: str | None = None, device: str | None = None) -> list[dict]:
    """The findings on a run (a tracekit Run), most predicted saving first, then the unpredicted ones by
    their share of the step. With out_dir, each finding's scenario is written there as <name>.toml.
    device: the catalog device the run's GPUs are, for a trace that does not name them (low_mfu's roofline; the
    memory findings' capacity where the trace does not give its totalGlobalMem)."""
    from replay.scenario import scenario_from_dict
    from replay.whatif import whatif

    from .findings import _per_rank_step, pipeline_stages

    if device is not None:  # a name not in the catalog: the error before any work
        from analyses.devices import catalog, given_device

        given_device(device, catalog())
    ctx = {"per_rank": _per_rank_step(run), "stages": pipeline_stages(run), "device": device}
    cands: list[Candidate] = []
    for detect in DETECTORS:
        cands += detect(run, ctx)
    names = [_name(c) for c in cands]
    modelled = [(n, c) for n, c in zip(names, cands) if c.scenario is not None]
    scenarios = [scenario_from_dict(c.scenario, f"{n}.toml") for n, c in modelled]
    table = whatif(run, scenarios)
    measured = int(table.loc[table.scenario == "measured", "measured_step_ns"].iloc[0])
    predicted = dict(zip(table.scenario, table.predicted_step_ns))
    out = []
    for n, c in zip(names, cands):
        pred = int(predicted[n]) if c.scenario is not None else None
        text = scenario_toml(c.scenario, comment=f"tracekit doctor: {c.title}") if c.scenario is not None else None
        if text is not None and out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f"{n}.toml"), "w") as f:
                f.write(text)
        saving = measured - pred if pred is not None else None
        out.append({"kind": c.kind, "rank": c.rank, "title": c.title, "evidence": c.evidence, "fix": c.fix,
                    "scenario": text, "measured_step_ns": measured, "predicted_step_ns": pred,
                    "saving_ns": saving, "saving_pct": 100.0 * saving / measured if saving is not None else None,
                    "confidence": c.confidence, "assumptions": c.assumptions, "_share": c.share_pct, "_name": n})
    out.sort(key=lambda f: (f["saving_ns"] is None, -(f["saving_ns"] or 0), -f["_share"]))
    return [{k: v for k, v in f.items() if not k.startswith("_")} | {"name": f["_name"]} for f in out]


def _name(c: Candidate) -> str:
    name = c.kind if c.rank is None else f"{c.kind}_rank{c.rank}"
    return f"{name}_{c.variant}" if c.variant else name


__all__ = ["FIELDS", "doctor"]
