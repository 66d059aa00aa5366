"""What-if validation against real runs: the results table of docs/whatif.md.

    python bench/whatif.py [--out docs/whatif_results.md]

Each row replays one bundled testbed trace under a scenario and compares the predicted step time
(the slowest rank's median over steps) with the measured step time of the run recorded under those
conditions (tracekit demo-train on the network-namespace testbed, scripts/make_samples.sh):
  links 4x faster     ddp2_2hosts_100mbit + bandwidth_scale 4    vs ddp2_2hosts_400mbit   (target 5%)
  links 4x slower     ddp2_2hosts_400mbit + bandwidth_scale 0.25 vs ddp2_2hosts_100mbit   (target 5%)
  data parallel 2->4  ddp2_2hosts_100mbit + [parallelism] dp = 4 vs ddp4_4hosts_100mbit   (target 10%)
  data parallel 4->2  ddp4_4hosts_100mbit + [parallelism] dp = 2 vs ddp2_2hosts_100mbit   (target 10%)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = [
    ("links 4x faster", "ddp2_2hosts_100mbit", {"network": {"bandwidth_scale": 4.0}}, "ddp2_2hosts_400mbit", 5.0),
    ("links 4x slower", "ddp2_2hosts_400mbit", {"network": {"bandwidth_scale": 0.25}}, "ddp2_2hosts_100mbit", 5.0),
    ("data parallel 2 -> 4", "ddp2_2hosts_100mbit", {"parallelism": {"dp": 4}}, "ddp4_4hosts_100mbit", 10.0),
    ("data parallel 4 -> 2", "ddp4_4hosts_100mbit", {"parallelism": {"dp": 2}}, "ddp2_2hosts_100mbit", 10.0),
]


def validate(tmp: str) -> list[dict]:
    import replay
    import tracekit
    from replay.scenario import scenario_from_dict

    def open_(name):
        return tracekit.open(str(REPO / "sample_traces" / name), store=os.path.join(tmp, name))

    rows = []
    for label, src, doc, dst, target in CASES:
        run, truth = open_(src), open_(dst)
        pred = replay.run(run, scenario_from_dict(doc, label)).summary().predicted_step_ns.max()
        meas = replay.run(truth).summary().measured_step_ns.max()
        err = 100.0 * (pred - meas) / meas
        rows.append({"scenario": label, "trace": src, "measured_run": dst, "predicted_ms": pred / 1e6,
                     "measured_ms": meas / 1e6, "error_pct": err, "target_pct": target, "met": abs(err) <= target})
        run.close()
        truth.close()
    return rows


def markdown(rows) -> str:
    out = ["| scenario | from trace | predicted step (ms) | measured run | measured step (ms) | error | target |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['scenario']} | `{r['trace']}` | {r['predicted_ms']:.1f} | `{r['measured_run']}` | "
                   f"{r['measured_ms']:.1f} | {r['error_pct']:+.1f}% | {'within' if r['met'] else 'OVER'} "
                   f"{r['target_pct']:g}% |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-whatif-") as tmp:
        rows = validate(tmp)
    text = markdown(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
