"""Many-ranks benchmark: ingest, standard analyses and comms analyses at 8, 128 and 1024 ranks.

    python bench/many_ranks.py [--ranks 8 128 1024] [--work DIR] [--timeout 600] [--no-replay] [--md docs/scale.md]

Trace sets come from bench/make_many_ranks.py (the bundled 4-rank gloo sample, re-timed per rank with
matching collectives) and are kept in --work. Each figure is measured in a fresh process:

- ingest: `tracekit.ingest.ingest(dir, store, force=True)` with the default local pool;
- re-ingest: the same call without --force (nothing changed: stat every file, load the manifest);
- temporal_breakdown: `tracekit.open(store).analyze("temporal_breakdown")` (`tracekit analyze`);
- collectives / stragglers: `analyses.comms.collectives_matched` / `straggler_attribution`
  (`tracekit comms collectives` / `tracekit comms stragglers`);
- replay: `replay.run(TRACE_DIR)` (folding automatic above 64 ranks).

Each line shows the seconds, the seconds per rank, and how the time per rank grows from the smallest
to the largest set (1.0 = linear in the number of ranks). A measurement over --timeout is reported
as such, not waited for.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from _common import write_md_block

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)




_STEPS = {
    "ingest": """
from tracekit.ingest import ingest
t = time.perf_counter(); r = ingest(D, S, force=True, progress=False); dt = time.perf_counter() - t
assert len(r.ingested) == N, (len(r.ingested), r.failed)
""",
    "re-ingest": """
from tracekit.ingest import ingest
t = time.perf_counter(); r = ingest(D, S, progress=False); dt = time.perf_counter() - t
assert len(r.unchanged) == N
""",
    "temporal_breakdown": """
import tracekit
t = time.perf_counter(); run = tracekit.open(S); df = run.analyze("temporal_breakdown"); dt = time.perf_counter() - t
assert len(df) >= N
""",
    "collectives": """
import tracekit
from analyses import comms
t = time.perf_counter(); run = tracekit.open(S); df = comms.collectives_matched(run); dt = time.perf_counter() - t
assert len(df) and int(df["n_participants"].min()) == N, df["n_participants"].min()
""",
    "stragglers": """
import tracekit
from analyses import comms
t = time.perf_counter(); run = tracekit.open(S); df = comms.straggler_attribution(run); dt = time.perf_counter() - t
assert len(df) == N
""",
    "replay": """
import replay
t = time.perf_counter(); replay.run(D); dt = time.perf_counter() - t
""",
}


def _measure(step: str, trace_dir: str, store: str, n: int, timeout: float) -> tuple[float | None, str]:
    code = ("import json, os, sys, time\nROOT = %r\nD, S, N = sys.argv[1], sys.argv[2], int(sys.argv[3])\n" % ROOT
            + textwrap.dedent(_STEPS[step]) + "\nprint('@@result ' + json.dumps({'s': dt}))\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([sys.executable, "-c", code, trace_dir, store, str(n)], capture_output=True, text=True,
                             env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"over {timeout:.0f} s"
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        return None, f"failed: {last[:160]}"
    # DuckDB's progress bar shares stdout (carriage returns, no newline): take what follows the marker
    if "@@result " not in out.stdout:
        return None, "failed: no result printed"
    s = json.loads(out.stdout.rsplit("@@result ", 1)[1].splitlines()[0])["s"]
    return s, "" if s is not None else "n/a"


def _trace_set(work: str, n: int) -> str:
    d = os.path.join(work, f"ranks-{n}")
    done = os.path.join(work, f"ranks-{n}.done")
    if not os.path.exists(done):
        t = time.perf_counter()
        subprocess.run([sys.executable, os.path.join(HERE, "make_many_ranks.py"), str(n), d], check=True)
        with open(done, "w") as f:
            json.dump({"make_s": time.perf_counter() - t}, f)
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 128, 1024])
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tracekit-many-ranks"))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per measurement")
    ap.add_argument("--no-replay", action="store_true", help="leave replay out")
    ap.add_argument("--only", nargs="+", choices=list(_STEPS), help="measure only these")
    ap.add_argument("--md", help="markdown file to put the table in (e.g. docs/scale.md)")
    a = ap.parse_args()
    steps = [s for s in (a.only or list(_STEPS)) if not (a.no_replay and s == "replay")]
    os.makedirs(a.work, exist_ok=True)
    res: dict[str, dict[int, tuple[float | None, str]]] = {s: {} for s in steps}
    for n in a.ranks:
        d = _trace_set(a.work, n)
        store = os.path.join(a.work, f"ranks-{n}.store")
        for step in steps:
            res[step][n] = _measure(step, d, store, n, a.timeout)
            s, why = res[step][n]
            print(f"{n:5d} ranks  {step:<20} " + (f"{s:8.2f} s  {s / n * 1000:8.2f} ms/rank" if s is not None else why),
                  flush=True)
    lo, hi = min(a.ranks), max(a.ranks)
    head = "| measurement | " + " | ".join(f"{n} ranks" for n in a.ranks) + f" | time per rank, {hi} vs {lo} |"
    lines = [f"`python bench/many_ranks.py --ranks {' '.join(map(str, a.ranks))}` ({os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d')}); seconds (ms per rank):", "", head,
             "| --- | " + " | ".join("---" for _ in a.ranks) + " | --- |"]
    for step in steps:
        cells = []
        for n in a.ranks:
            s, why = res[step][n]
            cells.append(f"{s:.2f} s ({s / n * 1000:.1f} ms)" if s is not None else why)
        s_lo, s_hi = res[step][lo][0], res[step][hi][0]
        growth = f"{(s_hi / hi) / (s_lo / lo):.2f}x" if s_lo and s_hi else "n/a"
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {growth} |")
    table = "\n".join(lines)
    print()
    print(table)
    if a.md:
        write_md_block(a.md, "many_ranks", table)
        print(f"\n(table written to {a.md})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
