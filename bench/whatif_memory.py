"""The memory what-ifs against runs recorded both ways: every run of one layout predicts every other
([batch] scale, [memory] activation_checkpointing), step time and peak allocated memory, against what was measured.

    scripts/record_memory_runs.sh runs/memory      # every layout x batch 8 / 16 x checkpointing none / full
    python bench/whatif_memory.py runs/memory [--write-docs]

Prints one Markdown table (every ordered pair, its errors) and a summary line per layout with the median and worst
absolute errors; --write-docs writes them into docs/whatif.md between the memory-whatif markers.

Repeated recordings (REPEATS=N scripts/record_memory_runs.sh runs/memory5: runs/memory5/rep1 .. repN) are read as
one set: what each run measures is the median of its N recordings, every recording of a run predicts every other
run of its layout (12 x N predictions a layout), and the table gives each pair's N errors, the error of their
median, and how far the recordings of the target run lie from their median (the measurement's own spread).
A recording's speed can move as a whole (a shared VM's run lands slow or fast: the same GEMM shape 1.2-1.3x
apart between two recordings of one run), and noise only adds time, so the summary also predicts the fastest
recording of each run from the fastest of its source, and splits those errors by what a pair changes (the batch,
checkpointing, both). --write-docs writes them between the memory-whatif-rep markers; --marker NAME between
another block's (a second set: memory-whatif-rep-6 for runs/memory6).
"""
from __future__ import annotations

import itertools
import pathlib
import re
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repository's analyses package, not bench/analyses.py

import tracekit  # noqa: E402
from _common import step_ns, write_md_block  # noqa: E402
from replay.scenario import scenario_from_dict  # noqa: E402
from replay.whatif import whatif  # noqa: E402

NAME = re.compile(r"(?P<layout>\w+?)_b(?P<batch>\d+)_ckpt_(?P<ckpt>none|full)$")


def measured(path: str) -> tuple[float, float]:
    with tracekit.open(path) as r:
        return step_ns(r), float(r.analyze("memory_peak").peak_allocated_bytes.max())


def recorded(root: pathlib.Path) -> dict:
    """layout -> {(batch, checkpointing): run directory} of one set of recordings."""
    runs = {}
    for d in sorted(root.iterdir()):
        m = NAME.match(d.name)
        if m and (d / "run.json").exists():
            runs.setdefault(m["layout"], {})[(int(m["batch"]), m["ckpt"])] = str(d)
    return runs


def predict(runs: dict) -> dict:
    """(a, b) -> (step ns, peak bytes) that run a of runs ({(batch, checkpointing): directory}) predicts for b's batch
    and checkpointing, every other run of runs; one what-if a source (its graph is built once)."""
    out = {}
    for a, path in runs.items():
        targets = [b for b in runs if b != a]
        scens = [scenario_from_dict({"name": f"b{b[0]}_{b[1]}", "batch": {"scale": b[0] / a[0]},
                                     "memory": {"activation_checkpointing": b[1]}}) for b in targets]
        with tracekit.open(path) as r:
            table = whatif(r, scens).set_index("scenario")
        for b, sc in zip(targets, scens):
            out[a, b] = (float(table.loc[sc.name, "predicted_step_ns"]),
                         float(table.loc[sc.name, "predicted_peak_alloc_bytes"]))
    return out


def _finish(lines: list, summary: list, marker: str, write_docs: bool) -> int:
    """The summary lines after the table, printed, and the whole written between marker's markers in
    docs/whatif.md with write_docs."""
    lines.append("")
    lines += [f"- {s}" for s in summary]
    print("\n".join(lines[-len(summary):]))
    if write_docs:
        write_md_block(str(REPO / "docs" / "whatif.md"), marker, "\n".join(lines))
    return 0


def main(root: str, write_docs: bool = False, marker: str | None = None) -> int:
    reps = sorted(p for p in pathlib.Path(root).glob("rep*") if p.is_dir())
    if reps:
        return main_repeated([recorded(p) for p in reps], write_docs, marker or "memory-whatif-rep")
    runs = recorded(pathlib.Path(root))
    lines = ["| layout | from (batch, checkpointing) | to | measured step (ms) | step error | measured peak (MB) "
             "| peak error |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    summary = []
    for layout, these in runs.items():
        meas = {k: measured(p) for k, p in these.items()}
        preds = predict(these)
        step_err, peak_err = [], []
        for a, b in itertools.permutations(these, 2):
            step_ns, peak_bytes = preds[a, b]
            se = 100 * (step_ns - meas[b][0]) / meas[b][0]
            pe = 100 * (peak_bytes - meas[b][1]) / meas[b][1]
            step_err.append(abs(se))
            peak_err.append(abs(pe))
            lines.append(f"| {layout} | {a[0]}, {a[1]} | {b[0]}, {b[1]} | {meas[b][0] / 1e6:.1f} | {se:+.1f}% "
                         f"| {meas[b][1] / 1e6:.2f} | {pe:+.1f}% |")
            print(lines[-1], flush=True)
        summary.append(f"{layout}: step median {statistics.median(step_err):.1f}% worst {max(step_err):.1f}%, "
                       f"{sum(e <= 10 for e in step_err)}/{len(step_err)} within 10%; peak median "
                       f"{statistics.median(peak_err):.1f}% worst {max(peak_err):.1f}%, "
                       f"{sum(e <= 10 for e in peak_err)}/{len(peak_err)} within 10%")
    return _finish(lines, summary, marker or "memory-whatif", write_docs)


def _band(errs: list) -> str:
    """'median / worst, k of n within 10%' of absolute errors in %."""
    a = [abs(e) for e in errs]
    return f"median {statistics.median(a):.1f}% worst {max(a):.1f}%, {sum(e <= 10 for e in a)}/{len(a)} within 10%"


def main_repeated(sets: list, write_docs: bool = False, marker: str = "memory-whatif-rep") -> int:
    """main over N recordings of the same runs (module docstring)."""
    n = len(sets)
    lines = [f"| layout | from (batch, checkpointing) | to | measured step (ms, median of {n}) | its recordings "
             f"| step error from each recording | of their median | fastest from fastest | measured peak (MB) "
             f"| peak errors |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary, every, medians, fasts, spreads, peaks_all = [], [], [], [], [], []
    by_change = {"the batch": [], "checkpointing": [], "both": []}  # fastest from fastest, by what the pair changes
    for layout in sets[0]:
        cfgs = [c for c in sets[0][layout] if all(c in s.get(layout, {}) for s in sets)]
        meas = {c: [measured(s[layout][c]) for s in sets] for c in cfgs}
        truth = {c: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for c, v in meas.items()}
        spread = {c: [100 * (x[0] - truth[c][0]) / truth[c][0] for x in v] for c, v in meas.items()}
        fastest = {c: min(range(n), key=lambda k: v[k][0]) for c, v in meas.items()}
        each = [predict({c: s[layout][c] for c in cfgs}) for s in sets]
        errs, med_errs, fast_errs, peak_errs = [], [], [], []
        for a, b in itertools.permutations(cfgs, 2):
            preds = [p[a, b] for p in each]
            se = [100 * (p[0] - truth[b][0]) / truth[b][0] for p in preds]
            pe = [100 * (p[1] - truth[b][1]) / truth[b][1] for p in preds]
            me = 100 * (statistics.median(p[0] for p in preds) - truth[b][0]) / truth[b][0]
            fb = meas[b][fastest[b]][0]
            fe = 100 * (preds[fastest[a]][0] - fb) / fb
            errs += se
            med_errs.append(me)
            fast_errs.append(fe)
            by_change["the batch" if a[1] == b[1] else "checkpointing" if a[0] == b[0] else "both"].append(fe)
            peak_errs += pe
            lines.append(f"| {layout} | {a[0]}, {a[1]} | {b[0]}, {b[1]} | {truth[b][0] / 1e6:.1f} | "
                         f"{min(spread[b]):+.1f}..{max(spread[b]):+.1f}% | {' '.join(f'{e:+.1f}%' for e in se)} | "
                         f"{me:+.1f}% | {fe:+.1f}% | {truth[b][1] / 1e6:.2f} | "
                         f"{' '.join(f'{e:+.1f}%' for e in pe)} |")
            print(lines[-1], flush=True)
        noise = [e for v in spread.values() for e in v]
        summary.append(f"{layout}: step from one recording {_band(errs)}; from the median of {n} {_band(med_errs)}; "
                       f"the fastest from the fastest {_band(fast_errs)}; a recording against its median "
                       f"{_band(noise)}; peak {_band(peak_errs)}")
        every += errs
        medians += med_errs
        fasts += fast_errs
        spreads += noise
        peaks_all += peak_errs
    summary.append(f"all layouts: step from one recording {_band(every)}; from the median of {n} {_band(medians)}; "
                   f"the fastest from the fastest {_band(fasts)}; a recording against its median {_band(spreads)}; "
                   f"peak {_band(peaks_all)}")
    summary.append("all layouts, the fastest from the fastest, by what the pair changes: " + "; ".join(
        f"{k} {_band(v)}" for k, v in by_change.items()))
    return _finish(lines, summary, marker, write_docs)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default="runs/memory", help="scripts/record_memory_runs.sh's recordings")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/whatif.md")
    ap.add_argument("--marker", help="the docs/whatif.md block to write (default: memory-whatif, memory-whatif-rep "
                    "for repeated recordings)")
    args = ap.parse_args()
    sys.exit(main(args.runs, args.write_docs, args.marker))
