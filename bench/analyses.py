"""Benchmark: every analysis on the ingested hta/df_index_resolver store, and HolisticTraceAnalysis's
load plus the same analyses in the same process. Not a timed test; prints the figures.

    python bench/analyses.py [--trace ../shared/traces/hta/df_index_resolver] [--store /tmp/tk-bench] [--repeat 3]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# run as a script, this file's own directory comes first on sys.path and its name would shadow
# the analyses package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "hta" / "df_index_resolver"
# HTA's counterpart of each analysis (None: HTA has none, or it fails on pandas 3 here)
HTA_SAME = {
    "temporal_breakdown": lambda ta, r: ta.get_temporal_breakdown(visualize=False),
    "comm_comp_overlap": lambda ta, r: ta.get_comm_comp_overlap(visualize=False),
    "idle_time_breakdown": lambda ta, r: ta.get_idle_time_breakdown(ranks=[r], visualize=False),
    "kernel_breakdown": lambda ta, r: ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True),
    "kernel_launch_stats": lambda ta, r: ta.get_cuda_kernel_launch_stats(ranks=[r], visualize=False),
    "queue_length_summary": lambda ta, r: ta.get_queue_length_summary(ranks=[r]),
    "memory_bandwidth_summary": lambda ta, r: ta.get_memory_bw_summary(ranks=[r]),
    "gpu_time_by_annotation": lambda ta, r: ta.get_gpu_user_annotation_breakdown(visualize=False),
    "kernel_sequences": lambda ta, r: ta.get_frequent_cuda_kernel_sequences(
        operator_name="aten::linear", output_dir=tempfile.mkdtemp(), rank=r, visualize=False),
    "critical_path": lambda ta, r: ta.critical_path_analysis(rank=r, annotation="ProfilerStep", instance_id=2),
}


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_tracekit(trace: Path, store: str, repeat: int) -> dict:
    import tracekit
    from analyses._sql import prepare
    from analyses.registry import REGISTRY

    tracekit.open(trace, store=store)  # ingest (not timed: the store is the point)
    # the store's first question computes the classified device ops and keeps them in the store (cache/)
    first_run = tracekit.open(trace, store=store)
    first_setup = {"connect": _time(lambda: first_run.sql("SELECT 1")),
                   "prepare": _time(lambda: prepare(first_run))}
    first_run.close()
    t0 = time.perf_counter()
    run = tracekit.open(trace, store=store)  # the up-to-date check of the trace directory, then the store
    opened = time.perf_counter() - t0
    rank = run.ranks[0]
    setup = {"open (up-to-date check)": opened, "connect": _time(lambda: run.sql("SELECT 1")),
             "prepare (rules, classified ops)": _time(lambda: prepare(run))}
    first, median = {}, {}
    for name, a in REGISTRY.items():
        call = (lambda a=a: a.func(run, other=run)) if a.needs_other_run else (lambda a=a: a.func(run))
        times = [_time(call) for _ in range(repeat)]
        first[name], median[name] = times[0], statistics.median(times)
    total_once = time.perf_counter() - t0 - sum(median.values()) * 0  # wall time incl. repeats
    once = sum(setup.values()) + sum(first.values())
    run.close()
    return {"rank": rank, "setup": setup, "first_setup": first_setup, "first": first, "median": median,
            "once_s": once, "wall_s": total_once}


def bench_hta(trace: Path, rank: int) -> dict:
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    out = {}
    t = time.perf_counter()
    ta = TraceAnalysis(trace_dir=str(trace))
    out["load"] = time.perf_counter() - t
    for name, fn in HTA_SAME.items():
        t = time.perf_counter()
        try:
            fn(ta, rank)
            out[name] = time.perf_counter() - t
        except Exception as e:  # HTA 0.5.0 on pandas 3: some paths fail; report, do not count
            out[name] = f"failed ({type(e).__name__})"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--store", default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-hta", action="store_true")
    a = p.parse_args(argv)
    if not a.trace.is_dir():
        print(f"{a.trace}: not found", file=sys.stderr)
        return 2
    store = a.store or tempfile.mkdtemp(prefix="tk-bench-")
    tk = bench_tracekit(a.trace, store, a.repeat)
    print(f"tracekit on {a.trace.name} (rank {tk['rank']})")
    for k, v in tk["setup"].items():
        print(f"  {k:<34} {v:8.3f} s")
    print(f"  (the store's first connection: connect {tk['first_setup']['connect']:.3f} s, prepare "
          f"{tk['first_setup']['prepare']:.3f} s, which computes the classified ops and keeps them in the store)")
    print(f"  {'analysis':<34} {'first':>8} {'median':>8}")
    for name in tk["first"]:
        flag = "" if tk["median"][name] < 0.3 or name.startswith("critical_path") else "  (> 0.3 s)"
        print(f"  {name:<34} {tk['first'][name]:8.3f} {tk['median'][name]:8.3f}{flag}")
    print(f"  all analyses once, incl. connect + prepare: {tk['once_s']:.3f} s")
    if a.no_hta:
        return 0
    try:
        hta = bench_hta(a.trace, tk["rank"])
    except ImportError:
        print("HTA not installed (pip install tracekit[hta]): no comparison")
        return 0
    print("HolisticTraceAnalysis 0.5.0, same process")
    for k, v in hta.items():
        print(f"  {k:<34} {v if isinstance(v, str) else f'{v:8.3f} s'}")
    done = [k for k, v in hta.items() if k != "load" and not isinstance(v, str)]
    hta_total = hta["load"] + sum(hta[k] for k in done)
    ours = sum(tk["setup"].values()) + sum(tk["first"][k] for k in done)
    ours_all = tk["once_s"]
    print(f"HTA load + {len(done)} analyses: {hta_total:.3f} s; tracekit same analyses incl. connect: {ours:.3f} s "
          f"-> {hta_total / ours:.1f}x; tracekit all {len(tk['first'])} analyses: {ours_all:.3f} s "
          f"-> {hta_total / ours_all:.1f}x")
    # one question on its own: HTA loads the trace and answers it; tracekit opens the store and answers it
    setup = sum(tk["setup"].values())
    ratios = {k: (hta["load"] + hta[k]) / (setup + tk["first"][k]) for k in done}
    print(f"one analysis alone (HTA load + it) / (tracekit open + connect + prepare + it), target >= 25x: " +
          ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()) +
          f"; lowest {min(ratios.values()):.1f}x, median {statistics.median(ratios.values()):.1f}x")
    first_setup = tk["setup"]["open (up-to-date check)"] + sum(tk["first_setup"].values())
    firsts = {k: (hta["load"] + hta[k]) / (first_setup + tk["first"][k]) for k in done}
    print(f"the store's first question (prepare computes and keeps the classified ops): lowest "
          f"{min(firsts.values()):.1f}x, median {statistics.median(firsts.values()):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
