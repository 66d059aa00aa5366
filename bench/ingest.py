"""Ingest benchmark: tracekit ingest vs HTA's load vs a bare JSON decode, same run.

    python bench/ingest.py [TRACE_DIR] [--repeat N]

Default trace: ../shared/traces/hta/df_index_resolver (54 MB uncompressed).
Each measurement runs in a fresh process (imports excluded from the timing,
as for HTA's TraceAnalysis load), best of N. Peak RSS is the ingest process's
ru_maxrss, interpreter and imports included. Prints the times and the ratios,
and a markdown table for the README.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _common import run_snippet

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT = os.path.join(ROOT, "..", "shared", "traces", "hta", "df_index_resolver")

_INGEST = """
import json, resource, sys, time
from tracekit.ingest import ingest
t = time.perf_counter()
ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_DECODE = """
import glob, gzip, json, os, resource, sys, time, zlib
import msgspec
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.json*")))
t = time.perf_counter()
size = 0
for f in files:
    raw = open(f, "rb").read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = zlib.decompress(raw, 31)
    size += len(raw)
    t1 = time.perf_counter()
    obj = msgspec.json.decode(raw)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "gunzip_s": t1 - t, "decode_s": time.perf_counter() - t1, "bytes": size}))
"""

_DECODERS = """
import json, os, sys, time, zlib, glob
raw = b"".join(zlib.decompress(open(f, "rb").read(), 31) if open(f, "rb").read(2) == b"\\x1f\\x8b" else open(f, "rb").read()
               for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json*"))))
out = {}
def best(fn):
    t = []
    for _ in range(3):
        t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
    return min(t)
out["json"] = best(lambda: json.loads(raw))
try:
    import orjson
    out["orjson"] = best(lambda: orjson.loads(raw))
except ImportError:
    pass
import msgspec
out["msgspec"] = best(lambda: msgspec.json.decode(raw))
split = msgspec.json.Decoder(list[msgspec.Raw])
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir", nargs="?", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hta", action="store_true", help="skip HTA (when the hta extra is not installed)")
    a = ap.parse_args()
    if not os.path.isdir(a.trace_dir):
        print(f"{a.trace_dir}: not found (the shared traces are not here)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        ingest = [run_snippet(_INGEST, a.trace_dir, os.path.join(tmp, "store")) for _ in range(a.repeat)]
        decode = [run_snippet(_DECODE, a.trace_dir) for _ in range(a.repeat)]
        decoders = run_snippet(_DECODERS, a.trace_dir)
        hta = None
        if not a.no_hta:
            try:
                hta = [run_snippet(_HTA, a.trace_dir) for _ in range(max(1, a.repeat - 1))]
            except RuntimeError as e:
                print(f"HTA not measured: {e}", file=sys.stderr)
    best = lambda rows: min(rows, key=lambda r: r["s"])  # noqa: E731
    ing, dec = best(ingest), best(decode)
    mb = dec["bytes"] / 1e6
    peak = max(r["rss_mb"] for r in ingest)
    rows = [
        ("tracekit ingest", f"{ing['s']:.3f} s", f"{mb / ing['s']:.0f} MB/s"),
        ("bare decode (gunzip + msgspec)", f"{dec['s']:.3f} s", f"gunzip {dec['gunzip_s']:.3f} s + decode {dec['decode_s']:.3f} s"),
    ]
    if hta:
        rows.append(("HTA 0.5.0 TraceAnalysis load", f"{best(hta)['s']:.3f} s", ""))
    print(f"trace: {os.path.relpath(a.trace_dir)} ({mb:.1f} MB uncompressed), best of {a.repeat}")
    for r in rows:
        print(f"  {r[0]:<34} {r[1]:>9}  {r[2]}")
    print(f"  ingest peak RSS                    {peak:.0f} MB ({peak / mb:.2f}x the uncompressed size; target <= 3x)")
    print(f"  ingest / bare decode               {ing['s'] / dec['s']:.2f}x (target <= 3x)")
    if hta:
        print(f"  HTA load / ingest                  {best(hta)['s'] / ing['s']:.2f}x faster (target >= 5x)")
    print("  decoders on the same JSON (gunzipped, best of 3): " +
          ", ".join(f"{k} {v:.3f} s" for k, v in decoders.items()))
    print()
    print("| measurement | time | ratio |")
    print("| --- | --- | --- |")
    print(f"| tracekit ingest | {ing['s']:.2f} s | 1 |")
    print(f"| bare decode (gunzip + msgspec) | {dec['s']:.2f} s | ingest = {ing['s'] / dec['s']:.2f}x |")
    if hta:
        print(f"| HTA 0.5.0 load | {best(hta)['s']:.2f} s | ingest {best(hta)['s'] / ing['s']:.1f}x faster |")
    print(f"| ingest peak RSS | {peak:.0f} MB | {peak / mb:.2f}x file size |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
