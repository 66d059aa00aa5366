"""Re-layout what-ifs against runs recorded under the new layout: docs/whatif.md's "Another layout" table.

    scripts/record_layout_runs.sh runs/layouts          # on a quiet machine, as root (the testbed)
    python bench/whatif_relayout.py --runs runs/layouts [--write-docs]

Runs are named <layout>_<R>r_<H>hosts_<rate>mbit. The layouts of issue "New parallelism from the traces alone":
DP (ddp), FSDP (fsdp), TP (tp) and PP (pp_gpipe, pp_1f1b) on 2 ranks, FSDP x TP (fsdp_tp) and DP x PP (dp_pp) on 4.
At each link rate, every ordered pair (a, b) of different layouts: run a, its run.json hidden (the traces alone:
the source is a folder of links to its trace files), re-laid out as b's degrees, micro-batches, schedule and
sharding ([parallelism]), with b's ranks a host ([network] gpus_per_node) and the NICs' rate a user knows
([network] nic_bandwidth_gbps), predicts run b's step (the slowest rank's median step, measured). Targets: every
pair within 10%, the median within 5%. Prints the whole matrix, worst pair included.
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

from _common import step_ns, write_md_block  # noqa: E402

_NAME = re.compile(r"^(?P<layout>[a-z0-9_]+?)_(?P<ranks>\d+)r_(?P<hosts>\d+)hosts_(?P<rate>\d+)mbit$")
# scripts/record_memory_runs.sh: <layout>_b<batch>_ckpt_<none|full>, on 2 hosts at 400 Mbit/s, [memory] events
_MEMORY_NAME = re.compile(r"^(?P<layout>[a-z0-9_]+?)_b(?P<batch>\d+)_ckpt_(?P<ckpt>none|full)$")
MEMORY_RATE_MBIT = 400
# the layouts the issue names, as [parallelism] keys
LAYOUTS = {
    "ddp": dict(dp=2, tp=1, pp=1, micro_batches=1, sharding="none"),
    "fsdp": dict(dp=2, tp=1, pp=1, micro_batches=1, sharding="fsdp"),
    "tp": dict(dp=1, tp=2, pp=1, micro_batches=1, sharding="none"),
    "pp_gpipe": dict(dp=1, tp=1, pp=2, micro_batches=4, schedule="gpipe", sharding="none"),
    "pp_1f1b": dict(dp=1, tp=1, pp=2, micro_batches=4, schedule="1f1b", sharding="none"),
    "fsdp_tp": dict(dp=2, tp=2, pp=1, micro_batches=1, sharding="fsdp"),
    # its data parallelism is replicate_with_fsdp's replicate (tracekit demo-layout, torchtitan's)
    "dp_pp": dict(dp=2, tp=1, pp=2, micro_batches=4, schedule="gpipe", sharding="replicate"),
}
RANKS = {"ddp": 2, "fsdp": 2, "tp": 2, "pp_gpipe": 2, "pp_1f1b": 2, "fsdp_tp": 4, "dp_pp": 4}


def memory_runs(root: Path) -> dict[str, dict]:
    """The memory recordings: pairs at the same batch and checkpointing (the rate key), with [memory] events.
    Repeated recordings (REPEATS=N scripts/record_memory_runs.sh: root/rep1 .. repN): each run is its fastest
    recording, the source and the target alike (a shared VM's recording lands slow or fast as a whole, and noise
    only adds time; bench/whatif_memory.py)."""
    reps = sorted(p for p in root.glob("rep*") if p.is_dir()) if root and root.is_dir() else []
    base = reps[0] if reps else root
    out = {}
    for p in sorted(base.iterdir()) if base and base.is_dir() else []:
        m = _MEMORY_NAME.match(p.name)
        if m and m["layout"] in LAYOUTS and (p / "run.json").exists():
            if reps:
                p = min((r / p.name for r in reps if (r / p.name / "run.json").exists()), key=_step_ns)
            out[p.name] = {"path": p, "layout": m["layout"], "hosts": 2, "ranks": RANKS[m["layout"]],
                           "rate": MEMORY_RATE_MBIT, "group": f"b{m['batch']}_{m['ckpt']}"}
    return out


def runs(root: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        m = _NAME.match(p.name)
        if m and m["layout"] in LAYOUTS and int(m["ranks"]) == RANKS[m["layout"]] and (p / "run.json").exists():
            out[p.name] = {"path": p, "layout": m["layout"], "hosts": int(m["hosts"]), "rate": int(m["rate"]),
                           "ranks": int(m["ranks"])}
    return out


def pairs(found: dict) -> list[tuple[str, str]]:
    """Every ordered pair of different layouts recorded at the same rate."""
    return [(a, b) for a, ra in found.items() for b, rb in found.items()
            if ra["rate"] == rb["rate"] and ra.get("group") == rb.get("group") and ra["layout"] != rb["layout"]]


def traces_only(run_dir: Path, tmp: Path) -> Path:
    """A folder holding links to run_dir's trace and flight-recorder files, without its run.json."""
    out = tmp / run_dir.name
    out.mkdir()
    for f in run_dir.iterdir():
        if f.name != "run.json" and f.is_file():
            (out / f.name).symlink_to(f.resolve())
    return out


def measured(path: Path, tmp: Path) -> tuple[float, float | None]:
    """(the run's step: its slowest rank's median, ns; its peak of allocated memory, the largest rank's, or None)."""
    import tracekit
    from analyses.memory import memory_peak

    run = tracekit.open(str(path), store=str(tmp / f"m_{path.name}"))
    mp = memory_peak(run)
    return step_ns(run), (float(mp.peak_allocated_bytes.max()) if len(mp) else None)


def _step_ns(path: Path) -> float:
    """measured's step of a recording, read from the store scripts/record_memory_runs.sh ingested."""
    import tracekit

    with tracekit.open(str(path)) as run:
        return step_ns(run)


def validate(found: dict, tmp: Path) -> list[dict]:
    import tracekit
    from replay.scenario import scenario_from_dict
    from replay.whatif import whatif

    rows = []
    by_src: dict[str, list[str]] = {}
    for a, b in pairs(found):
        by_src.setdefault(a, []).append(b)
    truth = {n: measured(r["path"], tmp) for n, r in found.items()}
    for a, targets in by_src.items():
        ra = found[a]
        run = tracekit.open(str(traces_only(ra["path"], tmp)), store=str(tmp / f"s_{a}"))
        scens = [scenario_from_dict({"name": b, "parallelism": LAYOUTS[found[b]["layout"]],
                                     "network": {"gpus_per_node": found[b]["ranks"] // found[b]["hosts"],
                                                 "nic_bandwidth_gbps": ra["rate"] / 8e3}}, b) for b in targets]
        t0 = time.perf_counter()
        table = whatif(run, scens).set_index("scenario")
        took = time.perf_counter() - t0
        for b in targets:
            pred = float(table.loc[b, "predicted_step_ns"])
            peak = table.loc[b, "predicted_peak_alloc_bytes"]
            step_b, peak_b = truth[b]
            rows.append({"from": a, "to": b, "rate": ra["rate"], "measured_ms": step_b / 1e6,
                         "source_ms": truth[a][0] / 1e6, "predicted_ms": pred / 1e6,
                         "err_pct": 100 * (pred - step_b) / step_b, "whatif_s": took / len(targets),
                         "peak_err_pct": (100 * (float(peak) - peak_b) / peak_b
                                          if peak_b and peak is not None and peak == peak else None)})
        print(f"{a}: {len(targets)} targets in {took:.1f} s", file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    errs = [abs(r["err_pct"]) for r in rows]
    peaks = [abs(r["peak_err_pct"]) for r in rows if r.get("peak_err_pct") is not None]
    out = [f"{len(rows)} ordered pairs: step median |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}%, "
           f"{sum(e <= 10 for e in errs)}/{len(rows)} within 10% (targets: all within 10%, median 5%)."]
    if peaks:
        out[0] += (f" Peak memory ({len(peaks)} pairs with [memory] events): median {statistics.median(peaks):.1f}%, "
                   f"worst {max(peaks):.1f}%, {sum(e <= 10 for e in peaks)}/{len(peaks)} within 10%.")
    out += ["", "| from (traces only) | to | measured (ms) | predicted (ms) | error | peak error |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["rate"], r["from"], r["to"])):
        pk = "" if r.get("peak_err_pct") is None else f"{r['peak_err_pct']:+.1f}%"
        out.append(f"| `{r['from']}` | `{r['to']}` | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
                   f"{r['err_pct']:+.1f}% | {pk} |")
    worst = max(rows, key=lambda r: abs(r["err_pct"]))
    out += ["", f"Worst: `{worst['from']}` -> `{worst['to']}` {worst['err_pct']:+.1f}%."]
    by = {}
    for r in rows:
        by.setdefault(found_layout(r["to"]), []).append(abs(r["err_pct"]))
    out += ["", "| to layout | pairs | median | worst |", "| --- | --- | --- | --- |"]
    for k, v in sorted(by.items()):
        out.append(f"| {k} | {len(v)} | {statistics.median(v):.1f}% | {max(v):.1f}% |")
    # the testbed's hosts are namespaces of one 2-core machine: a 4-rank run's 4 processes share its 2 cores
    groups = {}
    for r in rows:
        ranks = {"2r" if _ranks(r[k]) == 2 else "4r" for k in ("from", "to")}
        kind = "memory runs" if _MEMORY_NAME.match(r["from"]) else " <-> ".join(sorted(ranks)) if len(ranks) > 1 \
            else f"{ranks.pop()} -> same ranks"
        groups.setdefault((kind, r["rate"]), []).append(abs(r["err_pct"]))
    if peaks:  # a pipeline's memory follows its schedule, which a re-sized timeline of another layout does not show
        split = {}
        for r in rows:
            if r.get("peak_err_pct") is not None:
                piped = any(LAYOUTS[found_layout(r[k])]["pp"] > 1 for k in ("from", "to"))
                split.setdefault("a pipeline on either side" if piped else "no pipeline", []).append(r)
        out += ["", "| peak pairs | pairs | within 10% | median | worst |", "| --- | --- | --- | --- | --- |"]
        for k, v in sorted(split.items(), reverse=True):
            e = [abs(r["peak_err_pct"]) for r in v]
            w = max(v, key=lambda r: abs(r["peak_err_pct"]))
            out.append(f"| {k} | {len(v)} | {sum(x <= 10 for x in e)} | {statistics.median(e):.1f}% | "
                       f"{w['peak_err_pct']:+.1f}% (`{w['from']}` -> `{w['to']}`) |")
    out += ["", "| pairs | rate (Mbit/s) | pairs | median | worst | within 10% |", "| --- | --- | --- | --- | --- | --- |"]
    for (kind, rate), v in sorted(groups.items()):
        out.append(f"| {kind} | {rate} | {len(v)} | {statistics.median(v):.1f}% | {max(v):.1f}% | "
                   f"{sum(e <= 10 for e in v)} |")
    return "\n".join(out)


def _ranks(name: str) -> int:
    m = _NAME.match(name)
    return int(m["ranks"]) if m else 2


def found_layout(name: str) -> str:
    return (_NAME.match(name) or _MEMORY_NAME.match(name))["layout"]


MEGATRON = Path("../shared/traces/astra-sim/megatron_tp8")
MEGATRON_LAYOUTS = {"TP8 -> TP4 x DP2": {"tp": 4, "dp": 2},
                    "TP8 -> TP4 x PP2 (4 micro-batches, 1F1B)": {"tp": 4, "pp": 2, "micro_batches": 4}}


def megatron(tmp: Path) -> str:
    """The shared Megatron TP8 job re-laid out (no ground truth exists): each what-if's prediction and wall time."""
    import tracekit
    from replay.scenario import scenario_from_dict
    from replay.whatif import whatif

    path = (REPO / MEGATRON).resolve()
    if not path.is_dir():
        return f"(no {MEGATRON}: skipped)"
    run = tracekit.open(str(path), store=str(tmp / "megatron"))
    out = ["| what-if | measured step (ms) | predicted (ms) | change | what-if wall time (s) |",
           "| --- | --- | --- | --- | --- |"]
    for name, par in MEGATRON_LAYOUTS.items():
        t0 = time.perf_counter()
        row = whatif(run, [scenario_from_dict({"name": "x", "parallelism": par}, "x")]).iloc[1]
        took = time.perf_counter() - t0
        out.append(f"| {name} | {row.measured_step_ns / 1e6:.1f} | {row.predicted_step_ns / 1e6:.1f} | "
                   f"{row.change_pct:+.1f}% | {took:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "layouts")
    ap.add_argument("--rates", type=int, nargs="*", help="only these link rates (Mbit/s)")
    ap.add_argument("--memory-runs", type=Path, help="scripts/record_memory_runs.sh's recordings (peaks too)")
    ap.add_argument("--megatron", action="store_true", help="only the shared Megatron TP8 what-ifs and their time")
    ap.add_argument("--memory-only", action="store_true", help="only the --memory-runs pairs (no --runs)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/whatif.md")
    ap.add_argument("--marker", default="relayout-matrix", help="the docs/whatif.md block --write-docs writes")
    args = ap.parse_args()
    if args.megatron:
        with tempfile.TemporaryDirectory() as tmp:
            text = megatron(Path(tmp))
        print(text)
        if args.write_docs:
            write_md_block(str(REPO / "docs" / "whatif.md"), "relayout-megatron", text)
        return
    found = {} if args.memory_only else runs(args.runs)
    if args.rates:
        found = {k: v for k, v in found.items() if v["rate"] in args.rates}
    found.update(memory_runs(args.memory_runs))
    if not found:
        sys.exit(f"no memory runs under {args.memory_runs}: record them with scripts/record_memory_runs.sh"
                 if args.memory_only else
                 f"no layout runs under {args.runs}: record them with scripts/record_layout_runs.sh")
    with tempfile.TemporaryDirectory() as tmp:
        rows = validate(found, Path(tmp))
    text = markdown(rows)
    print(text)
    if args.write_docs:
        write_md_block(str(REPO / "docs" / "whatif.md"), args.marker, text)


if __name__ == "__main__":
    main()
