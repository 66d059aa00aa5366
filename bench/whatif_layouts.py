"""What-ifs on every parallel layout against runs recorded under the changed conditions: the tables of
docs/whatif.md's "Every layout" section.

    scripts/record_layout_runs.sh runs/layouts          # on a quiet machine, as root (the testbed)
    python bench/whatif_layouts.py --runs runs/layouts [--write-docs]
    python bench/whatif_layouts.py --samples            # the bundled small copies (sample_traces/layouts)

Runs are named <layout>_<R>r_<H>hosts_<rate>mbit (the samples <layout>_<H>hosts_<rate>mbit). For each layout,
rank count and host count recorded at several link rates, every ordered pair (a, b): run a replayed under
"the hosts' links r_b / r_a as fast" ([network.links.inter_node] bandwidth_scale; the fabric inside a host, loopback
on the testbed, stays) predicts run b's step (the slowest rank's median step, measured). For each 4-rank layout
recorded on 2 hosts (two ranks a host) and on 4 at one rate: one placement predicted from the other with
[topology] ranks_per_host. Both network models, same runs, same replay. Then, per layout, the exposed
communication that the exposed_comm analysis, `tracekit whatif`'s measured column, doctor and the report give
(one definition: they must agree); and doctor on the FSDP, TP and pipeline runs: its top finding and its "links
2x" prediction against the run recorded at twice the rate. Targets (issue "FSDP, tensor- and pipeline-parallel
runs re-timed right"): pairs within 5%, their median within 2%; 2 <-> 4 hosts within 10%; doctor within 10%.

Repeated recordings (REPEATS=N scripts/record_layout_runs.sh runs/r8 pairs: runs/r8/rep1 .. repN) are read as one
set. A shared VM's CPU speed drifts by tens of percent over minutes and noise only adds time, so each run's
measurement is its fastest recording, and the table predicts the fastest from the fastest. The summary adds each
sweep on its own (recording k of run a predicts recording k of run b, the default model: pairs minutes apart, as
one recording of the matrix would have them) and how far a recording's step lies from its run's fastest (the
measurement's own spread).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import pct  # noqa: E402

MODELS = ("links", "alpha_beta")  # the default first
# a pair whose runs' compute per step (compute_per_rank, the largest rank) differs by more changed more than its links
COMPUTE_STEADY = 0.05
_NAME = re.compile(r"^(?P<layout>[a-z0-9_]+?)_(?:(?P<ranks>\d+)r_)?(?P<hosts>\d+)hosts_(?P<rate>\d+)mbit$")


def _runs(root: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted(root.iterdir()) if (p / "run.json").exists()} if root.is_dir() else {}


def _sweeps(root: Path) -> list[dict[str, Path]]:
    """The recordings of the set: one {name: path} per repeated sweep (root/rep1 ..), or root's runs alone."""
    reps = sorted((p for p in root.glob("rep*") if p.is_dir()), key=lambda p: int(p.name[3:] or 0)) \
        if root.is_dir() else []
    return [r for r in (_runs(p) for p in reps) if r] or [_runs(root)]


def _store(tmp: str, path: Path) -> str:
    """The one store a recording is ingested into for the whole bench (its sweep's folder and its name)."""
    Path(tmp, path.parent.name).mkdir(parents=True, exist_ok=True)
    return f"{tmp}/{path.parent.name}/{path.name}"


def fastest(sweeps: list[dict[str, Path]], tmp: str) -> tuple[dict[str, Path], dict[str, list[float]]]:
    """Each run's fastest recording (its measured step, the slowest rank's median, as the table measures it) and
    every recording's step in ms, in sweep order."""
    import tracekit
    from _common import step_ns

    steps: dict[str, list[tuple[float, Path]]] = {}
    for sweep in sweeps:
        for name, path in sweep.items():
            run = tracekit.open(str(path), store=_store(tmp, path))
            steps.setdefault(name, []).append((step_ns(run) / 1e6, path))
            run.close()
    return ({n: min(v, key=lambda t: t[0])[1] for n, v in steps.items()},
            {n: [t[0] for t in v] for n, v in steps.items()})


def sweep_errors(sweeps: list[dict[str, Path]], tmp: str) -> list[list[float]]:
    """Per sweep, the default model's error on every rate pair whose two runs that sweep recorded."""
    return [[r["links"] for r in validate(sweep, tmp, models=("links",), diagnostic=False) if r["kind"] == "pair"]
            for sweep in sweeps]


def _groups(names) -> dict[tuple, dict[int, str]]:
    """(layout, ranks, hosts) -> {rate: run name}; a sample's rank count is its world size (read later)."""
    out: dict[tuple, dict[int, str]] = {}
    for n in names:
        m = _NAME.match(n)
        if m:
            out.setdefault((m["layout"], int(m["ranks"] or 0), int(m["hosts"])), {})[int(m["rate"])] = n
    return out


def cases(names) -> list[tuple]:
    """(kind, label, from run, scenario doc, measured run) for every case the recordings allow."""
    out = []
    groups = _groups(names)
    for (layout, ranks, hosts), by_rate in sorted(groups.items()):
        who = f"{layout}" + (f" {ranks} ranks" if ranks else "") + f" {hosts} hosts"
        for a in sorted(by_rate):
            for b in sorted(by_rate):
                if a != b:
                    doc = {"network": {"links": {"inter_node": {"bandwidth_scale": b / a}}}}
                    out.append(("pair", f"{who}: links {b}/{a} Mbit/s", by_rate[a], doc, by_rate[b]))
    for (layout, ranks, hosts), by_rate in sorted(groups.items()):
        if hosts != 2 or not ranks:
            continue
        other = groups.get((layout, ranks, 4), {})
        for rate in sorted(set(by_rate) & set(other)):
            two, four = by_rate[rate], other[rate]
            out.append(("hosts", f"{layout} {ranks} ranks: 2 -> 4 hosts at {rate} Mbit/s", two,
                        {"topology": {"ranks_per_host": 1}}, four))
            out.append(("hosts", f"{layout} {ranks} ranks: 4 -> 2 hosts at {rate} Mbit/s", four,
                        {"topology": {"ranks_per_host": ranks // 2}}, two))
    return out


def validate(runs: dict[str, Path], tmp: str, models=MODELS, diagnostic: bool = True) -> list[dict]:
    import replay
    import tracekit
    from replay.scenario import scenario_from_dict

    opened, measured, compute, per_rank = {}, {}, {}, {}

    def run_of(name):
        if name not in opened:
            opened[name] = tracekit.open(str(runs[name]), store=_store(tmp, runs[name]))
            measured[name] = int(replay.run(opened[name]).summary().measured_step_ns.max())
            per_rank[name] = compute_per_rank(opened[name])
            compute[name] = max(per_rank[name].values()) if per_rank[name] else None
        return opened[name]

    rows = []
    for kind, label, src, doc, dst in cases(runs):
        run_of(src), run_of(dst)
        row = {"kind": kind, "case": label, "from": src, "measured_run": dst, "measured_ms": measured[dst] / 1e6,
               "compute_ratio": compute[dst] / compute[src] if compute[src] and compute[dst] else None}
        for model in models:
            sc = scenario_from_dict({**doc, "network": {**doc.get("network", {}), "model": model}}, label)
            t = time.perf_counter()
            pred = int(replay.run(run_of(src), sc).summary().predicted_step_ns.max())
            row[model] = 100.0 * (pred - measured[dst]) / measured[dst]
            row[f"{model}_s"] = time.perf_counter() - t
        # a diagnostic, not a prediction: the default model told each rank's compute as run b measured it (run b's
        # over run a's, [compute] rank_slowdown), so what is left is the network model's own error
        a_, b_ = per_rank[src], per_rank[dst]
        slow = {str(r): b_[r] / a_[r] for r in a_ if r in b_ and a_[r] > 0 and b_[r] > 0}
        row["links_given_compute"] = None
        if slow and diagnostic:
            sc = scenario_from_dict({**doc, "compute": {"rank_slowdown": slow}}, label)
            pred = int(replay.run(run_of(src), sc).summary().predicted_step_ns.max())
            row["links_given_compute"] = 100.0 * (pred - measured[dst]) / measured[dst]
        rows.append(row)
        print(f"{label}: " + ", ".join(f"{m} {row[m]:+.1f}%" for m in models), file=sys.stderr, flush=True)
    for r in opened.values():
        r.close()
    return rows


def compute_per_rank(run) -> dict[int, float]:
    """Each rank's time per step outside exposed communication: the median over its steps of the step less its
    exposed communication (the exposed_comm analysis, the one definition). A replay keeps each op's measured time,
    so a pair whose two runs differ in this (the largest over ranks: `compute b/a`) changed more than its links:
    the ratio is printed beside each pair's error (the testbed's CPUs are shared; see the recording notes above the
    tables), and the per-rank ratios make the diagnostic column 'given b's compute'."""
    from analyses.exposed_comm import exposed_comm_per_rank

    per = exposed_comm_per_rank(run.analyze("exposed_comm"))
    rest = (per.step_ns - per.exposed_comm_ns)
    return {int(r): float(v) for r, v in zip(per["rank"], rest) if v == v}


def exposed_agreement(runs: dict[str, Path], tmp: str) -> list[dict]:
    """Per layout (its lowest-rate run on 2 hosts): exposed communication per step as the analysis, the what-if's
    measured column, doctor's evidence and the report's panel give it."""
    import tracekit
    from analyses.exposed_comm import exposed_comm_job_ns, exposed_comm_per_rank
    from replay.whatif import whatif
    from tracekit.advice import doctor
    from tracekit.report.data import exposed_per_rank

    rows = []
    for (layout, ranks, hosts), by_rate in sorted(_groups(runs).items()):
        if hosts != 2 or ranks == 4 and layout not in ("fsdp_tp", "dp_pp"):
            continue
        name = by_rate[min(by_rate)]
        run = tracekit.open(str(runs[name]), store=_store(tmp, runs[name]))
        df = run.analyze("exposed_comm")
        per = exposed_comm_per_rank(df)
        worst = per.sort_values("exposed_comm_ns").iloc[-1]
        table = whatif(run, [])
        found = [f for f in doctor(run) if f["kind"] == "exposed_communication" and f["rank"] is None]
        ev = found[0]["evidence"][0]["figure"] if found else ""
        m = re.search(r"rank (\d+): ([\d.]+) ms of exposed", ev)
        rows.append({"run": name, "analysis_ms": exposed_comm_job_ns(df) / 1e6,
                     "whatif_ms": table.measured_exposed_comm_ns.iloc[0] / 1e6,
                     "doctor_ms": float(m[2]) if m else None, "doctor_rank": int(m[1]) if m else None,
                     "report_ms": exposed_per_rank(run).exposed_comm_ns.max() / 1e6, "worst_rank": int(worst["rank"]),
                     "step_ms": worst.step_ns / 1e6})
        run.close()
    return rows


def doctor_checks(runs: dict[str, Path], tmp: str) -> list[dict]:
    """doctor on each FSDP / TP / pipeline run that has a run at twice its rate: the top finding, and its
    'links 2x' prediction against the run recorded at twice the rate."""
    import replay
    import tracekit
    from tracekit.advice import doctor

    rows = []
    for (layout, ranks, hosts), by_rate in sorted(_groups(runs).items()):
        if layout not in ("fsdp", "fsdp_noreshard", "tp", "tp_sp", "pp_gpipe", "pp_1f1b") or hosts != 2:
            continue
        for rate in sorted(by_rate):
            if 2 * rate not in by_rate:
                continue
            src, dst = by_rate[rate], by_rate[2 * rate]
            run = tracekit.open(str(runs[src]), store=_store(tmp, runs[src]))
            found = doctor(run)
            top = found[0] if found else None
            comm = next((f for f in found if f["kind"] == "exposed_communication" and f["rank"] is None), None)
            target = tracekit.open(str(runs[dst]), store=_store(tmp, runs[dst]))
            meas = int(replay.run(target).summary().measured_step_ns.max())
            pred = comm["predicted_step_ns"] if comm else None
            rows.append({"run": src, "twice": dst, "top": top["kind"] if top else "none",
                         "top_title": top["title"] if top else "",
                         "predicted_ms": pred / 1e6 if pred else None, "measured_ms": meas / 1e6,
                         "error_pct": 100.0 * (pred - meas) / meas if pred else None})
            run.close()
            target.close()
    return rows


def _summary(errs: list[float], what: str, goal: str) -> str:
    errs = sorted(abs(e) for e in errs)
    return (f"{what} over {len(errs)}: median |error| {statistics.median(errs):.1f}%, worst {errs[-1]:.1f}% "
            f"({goal})") if errs else f"{what}: none recorded"


def markdown(rows, exposed, doctors, sweeps=None, spread=None) -> str:
    out = ["| case | from run | measured run | measured step (ms) | compute b/a | default (links) | alpha-beta "
           "| default, given b's compute |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ratio = "n/a" if r.get("compute_ratio") is None else f"{r['compute_ratio']:.2f}"
        given = "n/a" if r.get("links_given_compute") is None else pct(r["links_given_compute"])
        out.append(f"| {r['case']} | `{r['from']}` | `{r['measured_run']}` | {r['measured_ms']:.1f} | {ratio} | "
                   f"{pct(r['links'])} | {pct(r['alpha_beta'])} | {given} |")
    out.append("")
    for model, name in (("links", "default model"), ("alpha_beta", "alpha-beta")):
        out.append("- " + _summary([r[model] for r in rows if r["kind"] == "pair"], f"{name}: rate pairs",
                                   "targets: median 2%, every pair 5%"))
        out.append("- " + _summary([r[model] for r in rows if r["kind"] == "hosts"], f"{name}: 2 <-> 4 hosts",
                                   "target: 10%"))
    steady = [r for r in rows if r["kind"] == "pair" and r.get("compute_ratio") is not None
              and abs(r["compute_ratio"] - 1) <= COMPUTE_STEADY]
    out.append("- " + _summary([r["links"] for r in steady], "default model: the rate pairs whose two runs' compute per "
                               f"step agrees within {100 * COMPUTE_STEADY:.0f}%", "the same targets; the rest changed "
                               "more than their links"))
    given = [r["links_given_compute"] for r in rows if r["kind"] == "pair" and r.get("links_given_compute") is not None]
    out.append("- " + _summary(given, "default model given each rank's compute as the measured run had it (a "
                               "diagnostic, not a prediction: the network model's own error): rate pairs",
                               "the same targets"))
    worst = {}
    for r in rows:
        if r["kind"] == "pair":
            lay = r["case"].split(":")[0]
            worst[lay] = max(worst.get(lay, 0.0), abs(r["links"]))
    out.append("- default model, worst pair per layout: " + ", ".join(f"{k} {v:.1f}%" for k, v in worst.items()))
    if sweeps and len(sweeps) > 1:
        out.append("- the table's run is each run's fastest of its recordings; each sweep on its own (recording k "
                   "of run a predicts recording k of run b): " + "; ".join(
                       _summary(e, f"sweep {k + 1}", "the same targets").replace(" (the same targets)", "")
                       for k, e in enumerate(sweeps)) + "; " + _summary([e for s in sweeps for e in s], "all sweeps",
                                                                       "the same targets"))
    if spread:
        gaps = [100.0 * (t - min(v)) / min(v) for v in spread.values() for t in v if len(v) > 1]
        if gaps:
            out.append(f"- the measurement's own spread: a recording's step over its run's fastest, median "
                       f"+{statistics.median(gaps):.1f}%, worst +{max(gaps):.1f}% over {len(gaps)} recordings "
                       f"of {len(spread)} runs")
    secs = [r["links_s"] for r in rows]
    if secs:
        out.append(f"- a what-if (graph, calibration, replay) took {statistics.median(secs):.2f} s median, "
                   f"{max(secs):.2f} s at most")
    if exposed:
        out += ["", "Exposed communication per step (ms), the worst rank's median, as each reader gives it:", "",
                "| run | exposed_comm analysis | whatif measured column | doctor | report | step (ms) |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for e in exposed:
            d = "none" if e["doctor_ms"] is None else f"{e['doctor_ms']:.1f} (rank {e['doctor_rank']})"
            out.append(f"| `{e['run']}` | {e['analysis_ms']:.1f} (rank {e['worst_rank']}) | {e['whatif_ms']:.1f} | "
                       f"{d} | {e['report_ms']:.1f} | {e['step_ms']:.1f} |")
    if doctors:
        out += ["", "doctor on the runs whose links bind: its top finding, and its \"links 2x\" prediction against "
                "the run recorded at twice the rate:", "",
                "| run | top finding | predicted at 2x (ms) | run at 2x | measured (ms) | error |",
                "| --- | --- | ---: | --- | ---: | ---: |"]
        for d in doctors:
            p = "n/a" if d["predicted_ms"] is None else f"{d['predicted_ms']:.1f}"
            out.append(f"| `{d['run']}` | {d['top']}: {d['top_title']} | {p} | `{d['twice']}` | "
                       f"{d['measured_ms']:.1f} | "
                       f"{pct(d['error_pct'])} |")
        errs = [d["error_pct"] for d in doctors if d["error_pct"] is not None]
        out.append("")
        out.append("- " + _summary(errs, "doctor's links 2x", "target: 10%"))
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=str(REPO / "runs" / "layouts"), help="scripts/record_layout_runs.sh's output")
    ap.add_argument("--samples", action="store_true", help="the bundled small copies instead (sample_traces/layouts)")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/whatif.md")
    ap.add_argument("--marker", default=None, help="the docs block to write (default: layouts-validation, "
                    "layouts-samples with --samples; the matrix recorded with --poll-idle: layouts-validation-poll)")
    a = ap.parse_args()
    root = REPO / "sample_traces" / "layouts" if a.samples else Path(a.runs)
    sweeps = _sweeps(root)
    if not sweeps[0]:
        sys.exit(f"no layout runs in {root}: record them with scripts/record_layout_runs.sh {root}")
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-layouts-") as tmp:
        runs, spread, each = sweeps[0], None, None
        if len(sweeps) > 1:
            runs, spread = fastest(sweeps, tmp)
            each = sweep_errors(sweeps, tmp)
        exposed = exposed_agreement(runs, tmp)
        doctors = doctor_checks(runs, tmp)
        rows = validate(runs, tmp)
    text = markdown(rows, exposed, doctors, each, spread)
    print(text)
    if a.write_docs:
        from _common import write_md_block

        marker = a.marker or ("layouts-samples" if a.samples else "layouts-validation")
        write_md_block(str(REPO / "docs" / "whatif.md"), marker, text)


if __name__ == "__main__":
    main()
