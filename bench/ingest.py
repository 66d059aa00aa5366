"""Ingest benchmark: tracekit ingest vs HTA 0.5.0's load vs a bare decode, all in the same run.

    python bench/ingest.py [TRACE_DIR ...] [--repeat N] [--no-hta] [--md docs/performance.md]

Default traces: ../shared/traces/hta/df_index_resolver, plus every other trace directory of
../shared/traces holding a trace of 20 MB or more uncompressed (today: none). Each measurement runs
in a fresh process, N times, and the median is kept (the machine is shared: medians of same-run
repeats, and ratios against baselines measured in the same run, are what to compare):

- tracekit ingest, in-process (`tracekit.ingest.ingest`, jobs=1, --force), imports excluded, as for HTA's
  `TraceAnalysis` load; its CPU seconds (user + sys, every thread) and peak RSS (ru_maxrss: interpreter and
  imports included);
- the baselines: HTA 0.5.0's `TraceAnalysis(trace_dir)` load (imports excluded) and a bare decode (gunzip +
  one msgspec decode of the whole file to Python objects);
- whole-process: `tracekit ingest DIR --store S --force` and a whole-process HTA load (`python -c` importing
  hta and loading), interpreter start and imports included;
- `tracekit --version` / `--help` wall time, and `tracekit.open(store)` + connect on the ingested store
  (the median, and the first after the ingest, which writes the store's views database)
  (imports excluded and included), each a fresh process.

Prints the figures and the ratios against the targets; with --md replaces the section between
`<!-- ingest -->` and `<!-- /ingest -->` of that file with the markdown table.
"""
from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, run_snippet, write_md_block

SHARED = os.path.join(ROOT, "..", "shared", "traces")
DEFAULT = os.path.join(SHARED, "hta", "df_index_resolver")
BIG_BYTES = 20_000_000  # the "every trace of 20 MB or more"

_INGEST = """
import json, resource, sys, time
from tracekit.ingest import ingest
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c = cpu()
t = time.perf_counter()
ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "cpu_s": cpu() - c, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_DECODE = """
import glob, json, os, sys, time, zlib
import msgspec
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.json*")))
t = time.perf_counter()
size = 0
gunzip = 0.0
for f in files:
    t0 = time.perf_counter()
    raw = open(f, "rb").read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = zlib.decompress(raw, 31)
    gunzip += time.perf_counter() - t0
    size += len(raw)
    obj = msgspec.json.decode(raw)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "gunzip_s": gunzip, "decode_s": dt - gunzip, "bytes": size}))
"""

_DECODERS = """
import glob, json, os, sys, time, zlib
import msgspec
raw = b"".join(zlib.decompress(open(f, "rb").read(), 31) if open(f, "rb").read(2) == b"\\x1f\\x8b" else open(f, "rb").read()
               for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json*"))))
def best(fn):
    t = []
    for _ in range(3):
        t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
    return min(t)
out = {"json": best(lambda: json.loads(raw))}
try:
    import orjson
    out["orjson"] = best(lambda: orjson.loads(raw))
except ImportError:
    pass
out["msgspec"] = best(lambda: msgspec.json.decode(raw))
class _Top(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
out["msgspec split into raw events"] = best(lambda: msgspec.json.decode(raw, type=_Top))
print(json.dumps(out))
"""

_HTA = """
import json, logging, os, sys, time, io, contextlib
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"s": time.perf_counter() - t}))
"""

_HTA_WHOLE = ("import logging, sys; logging.disable(logging.CRITICAL); "
              "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])")

_OPEN = """
import json, sys, time
t0 = time.perf_counter()
import duckdb, tracekit
t1 = time.perf_counter()
run = tracekit.open(sys.argv[1])
run.con
t2 = time.perf_counter()
print(json.dumps({"s": t2 - t1, "with_imports_s": t2 - t0}))
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    dt = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ...: {out.stderr.strip().splitlines()[-1:] or 'failed'}")
    return dt


def _cli(*args: str) -> list[str]:  # what the `tracekit` console script runs
    return [sys.executable, "-c", "import sys; from tracekit.cli import main; sys.argv[0] = 'tracekit'; main()", *args]


def _size(path: str) -> int:
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))
    return os.path.getsize(path)


def big_trace_dirs() -> list[str]:
    """Trace directories of ../shared/traces with a Kineto trace of BIG_BYTES or more uncompressed."""
    out = []
    for d, _dirs, files in os.walk(SHARED):
        if "chakra_et" in d:  # execution traces, not Kineto
            continue
        if any(f.endswith((".json", ".json.gz")) and _size(os.path.join(d, f)) >= BIG_BYTES for f in files):
            out.append(os.path.normpath(d))
    return sorted(out)


def med(rows, key="s"):
    return statistics.median(r[key] for r in rows)


def bench_one(trace_dir: str, repeat: int, hta: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        res = {"trace": os.path.relpath(trace_dir, ROOT)}
        # interleaved: each repeat measures every kind once, so a busy spell hits them alike
        ing, dec, hta_in, whole, hta_whole = [], [], [], [], []
        for _ in range(repeat):
            ing.append(run_snippet(_INGEST, trace_dir, store))
            dec.append(run_snippet(_DECODE, trace_dir))
            whole.append({"s": _wall(_cli("ingest", trace_dir, "--store", store, "--force", "--quiet"))})
            if hta:
                hta_in.append(run_snippet(_HTA, trace_dir))
                hta_whole.append({"s": _wall([sys.executable, "-c", _HTA_WHOLE, trace_dir])})
        # the first connection after an ingest writes the store's views database (Store.views_db), the later
        # ones attach it: the median is what a question pays, the first is shown beside it
        opens = [run_snippet(_OPEN, store) for _ in range(max(repeat, 5))]
        res["decoders"] = run_snippet(_DECODERS, trace_dir)
        res.update(mb=dec[0]["bytes"] / 1e6, ingest_s=med(ing), ingest_cpu_s=med(ing, "cpu_s"),
                   rss_mb=max(r["rss_mb"] for r in ing), decode_s=med(dec), gunzip_s=med(dec, "gunzip_s"),
                   whole_s=med(whole), open_s=med(opens), open_imports_s=med(opens, "with_imports_s"),
                   first_open_s=opens[0]["s"])
        if hta:
            res.update(hta_s=med(hta_in), hta_whole_s=med(hta_whole))
    return res


def startup(repeat: int) -> dict:
    return {args: statistics.median(_wall(_cli(*args.split())) for _ in range(max(repeat, 7)))
            for args in ("--version", "--help")} | {
        "python": statistics.median(_wall([sys.executable, "-c", "pass"]) for _ in range(max(repeat, 7)))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dirs", nargs="*")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hta", action="store_true", help="skip HTA (when the hta extra is not installed)")
    ap.add_argument("--md", help="markdown file to put the table in (e.g. docs/performance.md)")
    a = ap.parse_args()
    dirs = a.trace_dirs or sorted({os.path.normpath(DEFAULT), *big_trace_dirs()})
    for d in dirs:
        if not os.path.isdir(d):
            print(f"{d}: not found (the shared traces are not here)", file=sys.stderr)
            return 2
    hta = not a.no_hta
    if hta:
        try:
            run_snippet("import json, hta; print(json.dumps({}))")
        except RuntimeError as e:
            print(f"HTA not measured: {e}", file=sys.stderr)
            hta = False
    rows = [bench_one(d, a.repeat, hta) for d in dirs]
    st = startup(a.repeat)
    for r in rows:
        print(f"trace: {r['trace']} ({r['mb']:.1f} MB uncompressed), median of {a.repeat}")
        print(f"  tracekit ingest (in-process)     {r['ingest_s']:.3f} s  {r['mb'] / r['ingest_s']:.0f} MB/s, "
              f"{r['ingest_cpu_s']:.2f} CPU s")
        print(f"  bare decode (gunzip + msgspec)   {r['decode_s']:.3f} s  (gunzip {r['gunzip_s']:.3f} s)")
        print(f"  tracekit ingest, whole process   {r['whole_s']:.3f} s")
        if hta:
            print(f"  HTA 0.5.0 load                   {r['hta_s']:.3f} s; whole process {r['hta_whole_s']:.3f} s")
            print(f"  HTA load / ingest                {r['hta_s'] / r['ingest_s']:.2f}x (target >= 8x)")
            print(f"  whole process HTA / tracekit     {r['hta_whole_s'] / r['whole_s']:.2f}x (target >= 5x)")
        print(f"  ingest / bare decode             {r['ingest_s'] / r['decode_s']:.2f}x")
        print(f"  ingest peak RSS                  {r['rss_mb']:.0f} MB = {r['rss_mb'] / r['mb']:.2f}x the "
              "uncompressed size (target <= 3x)")
        print(f"  open + connect on the store      {r['open_s']:.3f} s ({r['open_imports_s']:.3f} s with imports; "
              f"target <= 0.1 s); the first after the ingest, which writes the views database: {r['first_open_s']:.3f} s")
        print("  decoders on the same JSON (gunzipped, best of 3): " +
              ", ".join(f"{k} {v:.3f} s" for k, v in r["decoders"].items()))
    print(f"tracekit --version {st['--version']:.3f} s, --help {st['--help']:.3f} s (target <= 0.15 s; "
          f"a bare `python -c pass` {st['python']:.3f} s)")

    day = time.strftime("%Y-%m-%d")
    head = ["trace (uncompressed)", "tracekit ingest (CPU s)", "bare decode", "HTA 0.5.0 load",
            "HTA / ingest (target >= 8x)", "whole process: tracekit / HTA", "HTA / tracekit (target >= 5x)",
            "peak RSS (target <= 3x file)", "open + connect (target <= 0.1 s)"]
    lines = [f"`python bench/ingest.py --repeat {a.repeat}` ({os.cpu_count()} cores, {day}); medians of "
             f"{a.repeat} fresh processes each, interleaved; CLI start: `tracekit --version` "
             f"{st['--version']:.3f} s, `--help` {st['--help']:.3f} s (target <= 0.15 s; bare Python "
             f"{st['python']:.3f} s).", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        na = "not measured"
        lines.append("| " + " | ".join([
            f"{r['trace'].split('traces/')[-1]} ({r['mb']:.1f} MB)",
            f"{r['ingest_s']:.3f} s ({r['ingest_cpu_s']:.2f})",
            f"{r['decode_s']:.3f} s",
            f"{r['hta_s']:.3f} s" if hta else na,
            f"{r['hta_s'] / r['ingest_s']:.2f}x" if hta else na,
            f"{r['whole_s']:.3f} s / " + (f"{r['hta_whole_s']:.3f} s" if hta else na),
            f"{r['hta_whole_s'] / r['whole_s']:.2f}x" if hta else na,
            f"{r['rss_mb']:.0f} MB = {r['rss_mb'] / r['mb']:.2f}x",
            f"{r['open_s']:.3f} s ({r['open_imports_s']:.3f} s with imports; the first after the ingest "
            f"{r['first_open_s']:.3f} s)"]) + " |")
    for r in rows:
        lines += ["", f"JSON decoders on {r['trace'].split('traces/')[-1]} (gunzipped, best of 3, to Python objects): " +
                  ", ".join(f"`{k}` {v:.3f} s" for k, v in r["decoders"].items()) + "."]
    table = "\n".join(lines)
    print()
    print(table)
    if a.md:
        write_md_block(a.md, "ingest", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
