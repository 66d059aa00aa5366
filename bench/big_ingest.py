"""Streaming-ingest benchmark: one large Kineto trace, 0.05 / 0.5 / 2 GB uncompressed.

    python bench/big_ingest.py [--sizes 0.05 0.5 2] [--work DIR] [--repeat N] [--md docs/scale.md]

Each trace is made by bench/make_big_trace.py from ../shared/traces/hta/df_index_resolver
(steps repeated with shifted timestamps and ids) and kept in --work for the next run.
For each size, in fresh processes:

- tracekit ingest of the one file (jobs=1, --force), imports excluded from the time;
  peak RSS = max(VmHWM of the ingest process, RUSAGE_CHILDREN: its worker children);
- the baseline, same file, same run: bare gunzip (zlib, as bench/ingest.py) + msgspec decode of
  every event to Python objects. A 2 GB trace decoded in one call would need ~20 GB, so the
  events are decoded in batches of 100,000 (the same work per byte, bounded memory).

Throughput is uncompressed MB / s of wall time, and MB per CPU second (the ingest process and its
children, user + sys), which a busy shared machine disturbs less than wall time. Prints a table, and with --md replaces the section between
`<!-- big_ingest -->` and `<!-- /big_ingest -->` in that file (appends it when absent).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from _common import run_snippet, write_md_block

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SRC = os.path.join(ROOT, "..", "shared", "traces", "hta", "df_index_resolver")

_MAKE = """
import json, sys
sys.path.insert(0, %r)
from make_big_trace import make_big_trace
print(json.dumps(make_big_trace(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
""" % HERE

_INGEST = """
import json, resource, sys, time
from tracekit.ingest import ingest
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
c0 = cpu()
t = time.perf_counter()
ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
dt = time.perf_counter() - t
# VmHWM, not ru_maxrss, for this process: Linux carries ru_maxrss across fork + exec (a child of a big
# process would start at its parent's mark); its worker children are forked from it, small
with open("/proc/self/status") as f:
    own = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"s": dt, "cpu_s": cpu() - c0, "rss_mb": max(own, kids), "self_mb": own, "children_mb": kids}))
"""

_DECODE = """
import json, resource, sys, time, zlib
import msgspec
class _Top(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
t = time.perf_counter()
c0 = time.process_time()
raw = open(sys.argv[1], "rb").read()
if raw[:2] == b"\\x1f\\x8b":
    raw = zlib.decompress(raw, 31)
size = len(raw)
t1 = time.perf_counter()
events = msgspec.json.decode(raw, type=_Top).traceEvents
n = 0
for i in range(0, len(events), 100_000):
    n += len(msgspec.json.decode(b"[" + b",".join(events[i:i + 100_000]) + b"]"))
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "cpu_s": time.process_time() - c0, "gunzip_s": t1 - t, "decode_s": time.perf_counter() - t1, "bytes": size, "events": n,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _trace(work: str, src: str, size_gb: float) -> tuple[str, dict]:
    """The trace directory for one size (made once, reused while its recipe matches)."""
    d = os.path.join(work, f"trace-{size_gb:g}gb")
    meta_path = os.path.join(work, f"trace-{size_gb:g}gb.meta.json")
    recipe = {"src": os.path.realpath(src), "size_gb": size_gb, "version": 2}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("recipe") == recipe and os.path.exists(os.path.join(d, "big.json.gz")):
            return d, meta
    os.makedirs(d, exist_ok=True)
    t = time.perf_counter()
    # in a child: a forked child's ru_maxrss starts at its parent's RSS, so this process must stay small
    r = run_snippet(_MAKE, os.path.join(d, "big.json.gz"), str(int(size_gb * 1e9)), src)
    meta = {"recipe": recipe, **r, "compressed": os.path.getsize(os.path.join(d, "big.json.gz")),
            "make_s": time.perf_counter() - t}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return d, meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.05, 0.5, 2.0], help="GB uncompressed")
    ap.add_argument("--src", default=DEFAULT_SRC)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tracekit-big-ingest"),
                    help="where the synthetic traces are kept between runs")
    ap.add_argument("--repeat", type=int, default=1, help="best of N (each in a fresh process)")
    ap.add_argument("--md", help="markdown file to put the table in (e.g. docs/scale.md)")
    a = ap.parse_args()
    if not os.path.exists(a.src):
        print(f"{a.src}: not found (the shared traces are not here)", file=sys.stderr)
        return 2
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for size in a.sizes:
        d, meta = _trace(a.work, a.src, size)
        mb = meta["bytes"] / 1e6
        with tempfile.TemporaryDirectory(dir=a.work) as tmp:
            ing = [run_snippet(_INGEST, d, os.path.join(tmp, "store")) for _ in range(a.repeat)]
        dec = [run_snippet(_DECODE, os.path.join(d, "big.json.gz")) for _ in range(a.repeat)]
        bi, bd = min(ing, key=lambda r: r["s"]), min(dec, key=lambda r: r["s"])
        peak = max(r["rss_mb"] for r in ing)
        ci, cd = min(r["cpu_s"] for r in ing), min(r["cpu_s"] for r in dec)
        row = {"size_gb": size, "mb": mb, "events": meta["events"], "gz_mb": meta["compressed"] / 1e6,
               "ingest_s": bi["s"], "ingest_mbps": mb / bi["s"], "decode_s": bd["s"], "decode_mbps": mb / bd["s"],
               "peak_rss_mb": peak, "decode_rss_mb": bd["rss_mb"], "ingest_cpu_mbps": mb / ci,
               "decode_cpu_mbps": mb / cd}
        rows.append(row)
        print(f"{mb:8.1f} MB ({meta['events']:,} events): ingest {bi['s']:6.2f} s = {row['ingest_mbps']:5.1f} MB/s, "
              f"peak RSS {peak:5.0f} MB | baseline gunzip+msgspec {bd['s']:6.2f} s = {row['decode_mbps']:5.1f} MB/s "
              f"(its RSS {bd['rss_mb']:.0f} MB) | ingest/baseline {bi['s'] / bd['s']:.2f}x | per CPU second: ingest "
              f"{row['ingest_cpu_mbps']:.1f} MB, baseline {row['decode_cpu_mbps']:.1f} MB", flush=True)
    first, first_cpu = rows[0]["ingest_mbps"], rows[0]["ingest_cpu_mbps"]
    lines = [f"`python bench/big_ingest.py --sizes {' '.join(f'{s:g}' for s in a.sizes)} --repeat {a.repeat}` "
             f"({os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}):",
             "",
             "| trace (uncompressed) | events | tracekit ingest | MB/s | MB/s vs smallest | MB per CPU s (vs smallest) "
             "| peak RSS (incl. workers) | baseline: gunzip + msgspec decode | baseline MB/s | baseline MB per CPU s "
             "| ingest time / baseline |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['mb']:.0f} MB ({r['gz_mb']:.0f} MB gzip) | {r['events']:,} | {r['ingest_s']:.2f} s "
                     f"| {r['ingest_mbps']:.1f} | {r['ingest_mbps'] / first:.2f}x "
                     f"| {r['ingest_cpu_mbps']:.1f} ({r['ingest_cpu_mbps'] / first_cpu:.2f}x) | {r['peak_rss_mb']:.0f} MB "
                     f"| {r['decode_s']:.2f} s | {r['decode_mbps']:.1f} | {r['decode_cpu_mbps']:.1f} "
                     f"| {r['ingest_s'] / r['decode_s']:.2f}x |")
    table = "\n".join(lines)
    print()
    print(table)
    if a.md:
        write_md_block(a.md, "big_ingest", table)
        print(f"\n(table written to {a.md})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
