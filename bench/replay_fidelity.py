"""Replay benchmark: fidelity per trace set and engine speed, written as markdown for docs/replay.md.

    python bench/replay_fidelity.py                 # every bundled sample + the shared GPU traces
    python bench/replay_fidelity.py --repeat 5 --out docs/replay_results.md

Fidelity: baseline replay (nothing changed) vs the measured step times, median over steps per rank
(the last, often truncated, step left out when a rank has others); the table shows the worst rank's
error and the mean absolute error over ranks.

Speed: the graph of ../shared/traces/hta/df_index_resolver (one rank, 216k events) built once, then
replayed --repeat times by the compiled core and by the same core interpreted (the baseline: a plain
Python heap loop), in this process; best time of each, nodes and edges per second, and the ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "traces"
GPU_SETS = ["astra-sim/megatron_tp8", "hta/df_index_resolver", "hta/trace_filter", "tracelens/b200_eager",
            "hta/critical_path/alexnet", "hta/critical_path/simple_add", "hta/critical_path/cuda_event_sync",
            "hta/critical_path/cuda_event_sync_multi_stream", "hta/ns_resolution_trace", "tracelens/h100_qwen_inference"]


def fidelity(tmp: str) -> list[dict]:
    import replay
    import tracekit

    # every bundled run: a folder with traces of its own (sample_traces/layouts holds one run a folder)
    runs = sorted(p.parent for p in (REPO / "sample_traces").glob("**/rank0.trace.json*"))
    sets = [(str(p.relative_to(REPO)), p) for p in runs]
    sets += [(rel, SHARED / rel) for rel in GPU_SETS if (SHARED / rel).exists()]
    rows = []
    for name, path in sets:
        run = tracekit.open(str(path), store=os.path.join(tmp, name.replace("/", "_")))
        res = replay.run(run)
        s = res.summary()
        d = res.to_dict()
        rows.append({"trace": name, "ranks": len(s), "steps": int(s.steps.min()),
                     "measured_ms": s.measured_step_ns.median() / 1e6, "predicted_ms": s.predicted_step_ns.median() / 1e6,
                     "worst_error_pct": d["error_pct"], "mean_abs_error_pct": d["mean_abs_error_pct"],
                     "nodes": d["nodes"], "edges": d["edges"], "collectives": d["collectives"],
                     "late_nodes": res.graph.stats.get("late_nodes", 0)})
        run.close()
    return rows


def speed(tmp: str, repeat: int) -> dict | None:
    import tracekit
    from analyses import depgraph as G
    from replay.engine import Engine

    path = SHARED / "hta" / "df_index_resolver"
    if not path.exists():
        return None
    run = tracekit.open(str(path), store=os.path.join(tmp, "speed"))
    builds = []
    for _ in range(max(1, repeat // 2)):
        t = time.perf_counter()
        g = G.build(run)
        builds.append(time.perf_counter() - t)
    out = {"nodes": g.n_nodes, "edges": g.n_edges, "build_s": min(builds)}
    for label, compiled in (("compiled", True), ("interpreted", False)):
        eng = Engine(g.n_nodes, g.src, g.dst, g.from_end, g.lag_ns, t0_ns=g.origin_ns, compiled=compiled)
        eng.run(g.dur_ns)  # warm-up (loads the compiled core from numba's cache)
        times = []
        for _ in range(repeat if compiled else max(1, repeat // 2)):
            t = time.perf_counter()
            eng.run(g.dur_ns)
            times.append(time.perf_counter() - t)
        out[f"{label}_s"] = min(times)
    run.close()
    return out


def markdown(rows, sp) -> str:
    lines = ["| trace | ranks | steps | measured step (ms, median) | predicted (ms) | worst rank error | "
             "mean abs error | nodes | edges | collectives | late nodes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| `{r['trace']}` | {r['ranks']} | {r['steps']} | {r['measured_ms']:.3f} | {r['predicted_ms']:.3f} | "
                     f"{r['worst_error_pct']:+.3f}% | {r['mean_abs_error_pct']:.3f}% | {r['nodes']:,} | {r['edges']:,} | "
                     f"{r['collectives']:,} | {r['late_nodes']:,} |")
    if sp:
        n, e = sp["nodes"], sp["edges"]
        lines += ["", "| `hta/df_index_resolver` graph | nodes | edges | time | nodes/s | edges/s | vs interpreted |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
                  f"| graph build | {n:,} | {e:,} | {sp['build_s']:.3f} s | {n / sp['build_s']:,.0f} | {e / sp['build_s']:,.0f} | |",
                  f"| replay, compiled core | {n:,} | {e:,} | {sp['compiled_s'] * 1e3:.1f} ms | {n / sp['compiled_s']:,.0f} | "
                  f"{e / sp['compiled_s']:,.0f} | {sp['interpreted_s'] / sp['compiled_s']:.1f}x |",
                  f"| replay, interpreted core (baseline) | {n:,} | {e:,} | {sp['interpreted_s'] * 1e3:.1f} ms | "
                  f"{n / sp['interpreted_s']:,.0f} | {e / sp['interpreted_s']:,.0f} | 1.0x |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the markdown tables to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-replay-") as tmp:
        rows = fidelity(tmp)
        sp = speed(tmp, args.repeat)
    text = markdown(rows, sp)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
