"""Scale benchmark: ingest, one analysis, a links what-if, a DP what-if and doctor at 1,024 / 4,096 / 16,384 ranks.

    python bench/scale.py [--ranks 1024 4096 16384] [--work DIR] [--timeout 1800] [--md docs/scale.md]
    python bench/scale.py --ranks 16384 --steps whatif_links4x doctor   (those rows again, the others kept)
    python bench/scale.py --ranks --work DIR --md docs/scale.md     (the table from the JSON files already there)

The N-rank sets come from bench/make_many_ranks.py (the bundled 4-rank gloo sample, re-timed per rank with matched
collectives; kept in --work, made once). Each measurement runs in a fresh process, timed from its start to its
answer, with the peak resident memory of the process and every process it starts (sampled every 50 ms: the ingest's
worker pool included):

- ingest: `tracekit.ingest.ingest(dir, store, force=True)` (the default local pool);
- temporal_breakdown: `tracekit.open(store).analyze("temporal_breakdown")` (`tracekit analyze`), cold: the store's
  cache emptied first;
- links 4x what-if: `replay.whatif.whatif(run, [links4x])` (`tracekit whatif DIR links4x.toml`,
  `[network] bandwidth_scale = 4`), cold, then again (warm: the measured run's exposed communication from the
  store's cache);
- DP what-if: `[parallelism] dp = 2N` (data parallelism doubled from the traces), warm;
- doctor: `tracekit.doctor(run)`, warm.

Results go to --work/scale-N.json as they come (a size can be run alone and the table rebuilt from every JSON
there), and the table between the markers `scale` of --md. The acceptance lines of docs/scale.md are printed with
each figure: at 4,096 ranks the links what-if under 60 s and 4 GB, temporal_breakdown under 5 s and 2 GB, ingest
under 1 GB; at 16,384 every step under 8 GB.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

from _common import ROOT, write_md_block

STEPS = {
    "ingest": """
from tracekit.ingest import ingest
r = ingest(D, S, force=True, progress=False)
assert len(r.ingested) == N, (len(r.ingested), r.failed)
out = {}
""",
    "temporal_breakdown": """
import tracekit
run = tracekit.open(S)
df = run.analyze("temporal_breakdown")
assert len(df) == N
out = {"busy_ns_sum": int(df.busy_ns.sum()), "compute_ns_sum": int(df.compute_ns.sum())}
""",
    "whatif_links4x": """
import tracekit
from replay.scenario import scenario_from_dict
from replay.whatif import whatif
run = tracekit.open(S)
df = whatif(run, [scenario_from_dict({"network": {"bandwidth_scale": 4.0}}, "links4x")])
r = df.iloc[1]
out = {k: (None if r[k] != r[k] else int(r[k])) for k in ("measured_step_ns", "predicted_step_ns",
       "measured_exposed_comm_ns", "exposed_comm_ns")}
""",
    "whatif_dp2x": """
import tracekit
from replay.scenario import scenario_from_dict
from replay.whatif import whatif
run = tracekit.open(S)
df = whatif(run, [scenario_from_dict({"parallelism": {"dp": 2 * N}}, "dp2x")])
r = df.iloc[1]
out = {k: (None if r[k] != r[k] else int(r[k])) for k in ("measured_step_ns", "predicted_step_ns")}
""",
    "doctor": """
import tracekit
run = tracekit.open(S)
found = tracekit.doctor(run)
out = {"findings": len(found), "top": found[0]["kind"] if found else None}
""",
}
# (step, label, clear the store's cache first)
PLAN = [("ingest", "ingest", False), ("temporal_breakdown", "temporal_breakdown (cold)", True),
        ("whatif_links4x", "links 4x what-if (cold)", True), ("whatif_links4x", "links 4x what-if (warm)", False),
        ("whatif_dp2x", "DP 2x what-if", False), ("doctor", "doctor", False)]
# the acceptance lines (issue "Scale to the jobs the survey is about"): (ranks, label) -> (max s, max GB)
TARGETS = {(4096, "links 4x what-if (cold)"): (60, 4.0), (4096, "temporal_breakdown (cold)"): (5, 2.0),
           (4096, "ingest"): (None, 1.0)}
BIG_GB = 8.0  # 16,384 ranks: every step under 8 GB


def _tree_rss(proc) -> int:
    import psutil

    try:
        p = psutil.Process(proc.pid)
        procs = [p] + p.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(step: str, n: int, trace_dir: str, store: str, timeout: float) -> dict:
    code = (f"import json, sys, time\nt0 = time.perf_counter()\nD, S, N = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
            + textwrap.dedent(STEPS[step]) + "\nprint('@@result ' + json.dumps({'s': time.perf_counter() - t0, **out}))\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", code, trace_dir, store, str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc))
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"over {timeout:.0f} s", "wall_s": time.perf_counter() - t0, "peak_gb": peak[0] / 1e9}
    finally:
        done.set()
        th.join()
    line = [x for x in out.splitlines() if x.startswith("@@result ")]
    if proc.returncode != 0 or not line:
        last = (err.strip().splitlines() or ["failed"])[-1]
        return {"error": last[:300], "wall_s": time.perf_counter() - t0, "peak_gb": peak[0] / 1e9}
    r = json.loads(line[-1][len("@@result "):])
    r["wall_s"] = time.perf_counter() - t0
    r["peak_gb"] = peak[0] / 1e9
    return r


def run_size(n: int, work: str, timeout: float, steps: set | None = None) -> dict:
    """Measure PLAN's steps at n ranks (steps: only these, the other rows kept from --work's scale-N.json)."""
    d = os.path.join(work, f"set{n}")
    store = os.path.join(work, f"store{n}")
    path = os.path.join(work, f"scale-{n}.json")
    if not os.path.isdir(d) or len(glob.glob(os.path.join(d, "*.trace.json.gz"))) != n:
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_many_ranks.py"), str(n), d, "--seed", "1"],
                       check=True)
    kept = {}
    if steps is not None and os.path.isfile(path):
        with open(path) as f:
            kept = {r["label"]: r for r in json.load(f)["rows"]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    rows = []
    for step, label, cold in PLAN:
        if steps is not None and step not in steps:
            if label in kept:
                rows.append(kept[label])
            continue
        if cold:
            shutil.rmtree(os.path.join(store, "cache"), ignore_errors=True)
        r = measure(step, n, d, store, timeout)
        r.update(step=step, label=label, date=time.strftime("%Y-%m-%d"), commit=commit)
        rows.append(r)
        print(f"{n:6d} ranks  {label:28s} " + (f"{r['wall_s']:7.1f} s  {r['peak_gb']:5.2f} GB" if "error" not in r
              else f"FAILED ({r['error']})"), flush=True)
        if step == "ingest" and "error" in r:
            break
    result = {"ranks": n, "rows": rows, "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def table(results: list[dict]) -> str:
    sizes = [r["ranks"] for r in results]
    labels = [label for _, label, _ in PLAN]
    head = "| measurement | " + " | ".join(f"{n:,} ranks" for n in sizes) + " | target |\n"
    head += "| --- | " + " | ".join("---:" for _ in sizes) + " | --- |\n"
    lines = []
    for label in labels:
        cells = []
        for res in results:
            r = next((x for x in res["rows"] if x["label"] == label), None)
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append(f"failed: {r['error'][:100]}")
            else:
                cells.append(f"{r['wall_s']:.1f} s, {r['peak_gb']:.2f} GB")
        goals = []
        for (n, lab), (s, gb) in TARGETS.items():
            if lab == label:
                goals.append(f"{n:,}: " + (f"< {s} s, " if s else "") + f"< {gb:g} GB")
        if 16384 in sizes:
            goals.append(f"16,384: < {BIG_GB:g} GB")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'; '.join(goals)} |")
    return head + "\n".join(lines)


def verdicts(results: list[dict]) -> list[str]:
    out = []
    for res in results:
        for r in res["rows"]:
            key = (res["ranks"], r["label"])
            ok = None
            if key in TARGETS and "error" not in r:
                s, gb = TARGETS[key]
                ok = (s is None or r["wall_s"] < s) and r["peak_gb"] < gb
            elif res["ranks"] == 16384:
                ok = "error" not in r and r["peak_gb"] < BIG_GB
            if ok is not None:
                out.append(f"{res['ranks']:,} ranks, {r['label']}: " + ("met" if ok else "NOT met") +
                           (f" ({r['wall_s']:.1f} s, {r['peak_gb']:.2f} GB)" if "error" not in r else f" ({r['error']})"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[1024, 4096, 16384],
                    help="sizes to measure (none: only rebuild the table from --work's scale-N.json)")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "scale"))
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--steps", nargs="+", choices=sorted(STEPS), default=None,
                    help="measure only these steps (the other rows kept from --work's scale-N.json: the ingest of an "
                         "unchanged store need not run again)")
    ap.add_argument("--md", default=None, help="write the table into this markdown file (marker: scale)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    for n in a.ranks:
        run_size(n, a.work, a.timeout, set(a.steps) if a.steps else None)
    results = []
    for path in sorted(glob.glob(os.path.join(a.work, "scale-*.json")), key=lambda p: int(p.split("-")[-1][:-5])):
        with open(path) as f:
            results.append(json.load(f))
    md = table(results)
    print(md)
    for v in verdicts(results):
        print(v)
    if a.md:
        write_md_block(a.md, "scale", f"`python bench/scale.py --ranks {' '.join(str(r['ranks']) for r in results)}` "
                                      f"({results[0]['cores'] if results else '?'} cores, {results[-1]['date'] if results else ''}):\n\n" + md)


if __name__ == "__main__":
    main()
