"""Replay at scale: graph build, replay (every rank, and folded) and a what-if at 8, 128 and 1,024 ranks,
plus a 16,384-rank data-parallel what-if.

    python bench/replay_scale.py [--ranks 8 128 1024] [--out docs/replay_scale.md]

The N-rank sets come from bench/make_many_ranks.py (copies of the bundled 4-rank gloo sample with
jittered arrivals and matched collectives). Baselines measured in the same run: the unfolded replay
for the folded one (same graph), and the 8-rank figures for the growth ratios (time per rank).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def measure(n: int, tmp: str) -> dict:
    import tracekit
    from analyses import depgraph as G
    from replay.replayer import replay
    from replay.scenario import scenario_from_dict

    d = os.path.join(tmp, f"set{n}")
    subprocess.run([sys.executable, str(REPO / "bench" / "make_many_ranks.py"), str(n), d, "--seed", "1"],
                   check=True, capture_output=True)
    t = time.perf_counter()
    run = tracekit.open(d, store=os.path.join(tmp, f"store{n}"))
    ingest_s = time.perf_counter() - t
    t = time.perf_counter()
    g = G.build(run)
    build_s = time.perf_counter() - t
    replay(run, graph=g, fold=False)  # warm (numba cache)
    t = time.perf_counter()
    full = replay(run, graph=g, fold=False)
    full_s = time.perf_counter() - t
    t = time.perf_counter()
    folded = replay(run, graph=g, fold=True)
    fold_s = time.perf_counter() - t
    bw4 = scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "bw4")
    t = time.perf_counter()
    w_full = replay(run, bw4, graph=g, fold=False)
    whatif_s = time.perf_counter() - t
    t = time.perf_counter()
    w_fold = replay(run, bw4, graph=g, fold=True)
    whatif_fold_s = time.perf_counter() - t
    a, b = w_full.summary(), w_fold.summary()
    agree = float(((b.predicted_step_ns - a.predicted_step_ns).abs() / a.predicted_step_ns * 100).max())
    run.close()
    return {"ranks": n, "nodes": g.n_nodes, "edges": g.n_edges, "ingest_s": ingest_s, "build_s": build_s,
            "replay_s": full_s, "engine_s": full.replay_s, "engine_nodes_per_s": g.n_nodes / max(full.replay_s, 1e-9),
            "folded_s": fold_s, "classes": folded.folding.classes if folded.folding else n,
            "whatif_s": whatif_s, "whatif_folded_s": whatif_fold_s, "fold_agree_pct": agree}


def dp16k(tmp: str) -> dict:
    import tracekit
    from replay.scenario import scenario_from_dict
    from replay.whatif import whatif

    run = tracekit.open(str(REPO / "sample_traces" / "ddp4_4hosts_100mbit"), store=os.path.join(tmp, "dp16k"))
    t = time.perf_counter()
    df = whatif(run, [scenario_from_dict({"parallelism": {"dp": 16384}}, "dp16384")])
    s = time.perf_counter() - t
    row = df.set_index("scenario").loc["dp16384"]
    run.close()
    return {"seconds": s, "measured_ms": row.measured_step_ns / 1e6, "predicted_ms": row.predicted_step_ns / 1e6}


def markdown(rows, big) -> str:
    base = rows[0]
    out = ["| ranks | nodes | edges | ingest | graph build | replay, every rank | engine nodes/s | replay, folded "
           "(classes) | what-if, every rank | what-if, folded | folded vs every rank | build time/rank vs "
           f"{base['ranks']} ranks |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        growth = (r["build_s"] / r["ranks"]) / (base["build_s"] / base["ranks"])
        out.append(f"| {r['ranks']:,} | {r['nodes']:,} | {r['edges']:,} | {r['ingest_s']:.1f} s | {r['build_s']:.2f} s | "
                   f"{r['replay_s']:.2f} s | {r['engine_nodes_per_s']:,.0f} | {r['folded_s']:.2f} s ({r['classes']}) | "
                   f"{r['whatif_s']:.2f} s | {r['whatif_folded_s']:.2f} s | {r['fold_agree_pct']:.2f}% | {growth:.2f}x |")
    if big:
        out += ["", f"Data parallelism 4 -> 16,384 on `ddp4_4hosts_100mbit` (`[parallelism] dp = 16384`, the added ranks "
                f"folded into the measured ones): {big['seconds']:.1f} s for the baseline and the what-if "
                f"(measured {big['measured_ms']:.1f} ms, predicted {big['predicted_ms']:.1f} ms per step)."]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 128, 1024])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-replay-scale-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        rows = []
        for n in args.ranks:
            rows.append(measure(n, tmp))
            print(rows[-1], flush=True)
        big = dp16k(tmp)
    text = markdown(rows, big)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
