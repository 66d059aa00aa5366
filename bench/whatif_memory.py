"""The memory what-ifs against runs recorded both ways: every run of one layout predicts every other
([batch] scale, [memory] activation_checkpointing), step time and peak allocated memory, against what was measured.

    scripts/record_memory_runs.sh runs/memory      # every layout x batch 8 / 16 x checkpointing none / full
    python bench/whatif_memory.py runs/memory [--write-docs]

Prints one Markdown table (every ordered pair, its errors) and a summary line per layout with the median and worst
absolute errors; --write-docs writes them into docs/whatif.md between the memory-whatif markers.
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
from replay.scenario import scenario_from_dict  # noqa: E402
from replay.whatif import whatif  # noqa: E402

NAME = re.compile(r"(?P<layout>\w+?)_b(?P<batch>\d+)_ckpt_(?P<ckpt>none|full)$")


def measured(path: str) -> tuple[float, float]:
    with tracekit.open(path) as r:
        step = r.sql("SELECT max(m) AS m FROM (SELECT rank, median(dur_ns) AS m FROM steps WHERE NOT is_last "
                     "GROUP BY rank)").m.iloc[0]
        return float(step), float(r.analyze("memory_peak").peak_allocated_bytes.max())


def main(root: str, write_docs: bool = False) -> int:
    runs = {}
    for d in sorted(pathlib.Path(root).iterdir()):
        m = NAME.match(d.name)
        if m and (d / "run.json").exists():
            runs.setdefault(m["layout"], {})[(int(m["batch"]), m["ckpt"])] = str(d)
    lines = ["| layout | from (batch, checkpointing) | to | measured step (ms) | step error | measured peak (MB) "
             "| peak error |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    summary = []
    for layout, these in runs.items():
        meas = {k: measured(p) for k, p in these.items()}
        step_err, peak_err = [], []
        for a, b in itertools.permutations(these, 2):
            sc = scenario_from_dict({"name": "x", "batch": {"scale": b[0] / a[0]},
                                     "memory": {"activation_checkpointing": b[1]}})
            with tracekit.open(these[a]) as r:
                row = whatif(r, [sc]).iloc[1]
            se = 100 * (row.predicted_step_ns - meas[b][0]) / meas[b][0]
            pe = 100 * (row.predicted_peak_alloc_bytes - meas[b][1]) / meas[b][1]
            step_err.append(abs(se))
            peak_err.append(abs(pe))
            lines.append(f"| {layout} | {a[0]}, {a[1]} | {b[0]}, {b[1]} | {meas[b][0] / 1e6:.1f} | {se:+.1f}% "
                         f"| {meas[b][1] / 1e6:.2f} | {pe:+.1f}% |")
            print(lines[-1], flush=True)
        summary.append(f"{layout}: step median {statistics.median(step_err):.1f}% worst {max(step_err):.1f}%, "
                       f"{sum(e <= 10 for e in step_err)}/{len(step_err)} within 10%; peak median "
                       f"{statistics.median(peak_err):.1f}% worst {max(peak_err):.1f}%, "
                       f"{sum(e <= 10 for e in peak_err)}/{len(peak_err)} within 10%")
    lines.append("")
    lines += [f"- {s}" for s in summary]
    print("\n".join(lines[-len(summary):]))
    if write_docs:
        from _common import write_md_block

        write_md_block(str(REPO / "docs" / "whatif.md"), "memory-whatif", "\n".join(lines))
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default="runs/memory", help="scripts/record_memory_runs.sh's recordings")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/whatif.md")
    args = ap.parse_args()
    sys.exit(main(args.runs, args.write_docs))
