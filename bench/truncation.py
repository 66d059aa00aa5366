"""Truncation salvage: a real trace cut at N seeded random byte offsets, each ingested.

    python bench/truncation.py [TRACE.json(.gz)] [--cuts 20] [--seed 0]

Default trace: ../shared/traces/hta/df_index_resolver/df_index_resolver.json.gz.
The ground truth is computed independently of tracekit's reader: the original is
walked with Python's json decoder event by event, recording each event's end
offset; the events complete before a cut are those ending at or before it. A cut
file is written as plain JSON (a profiler killed mid-write leaves a prefix), and
ingested; recovered = the ingest's event_count (manifest), lost = its reported
lost_event_count. Prints one row per cut and the overall recovery %.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = ROOT.parent / "shared" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"


def event_end_offsets(text: bytes) -> list[int]:
    """Byte offsets just past each element of traceEvents, with the stdlib decoder (not tracekit's)."""
    s = text.decode("utf-8")
    if not s.isascii():  # offsets must be byte offsets: work on bytes positions via an ascii view
        raise ValueError("non-ASCII trace: byte offsets would need re-mapping")
    key = s.index('"traceEvents"')
    i = s.index("[", key) + 1
    dec = json.JSONDecoder()
    ends = []
    n = len(s)
    while True:
        while i < n and s[i] in " \t\r\n,":
            i += 1
        if s[i] == "]":
            return ends
        _, i = dec.raw_decode(s, i)
        ends.append(i)


def measure(text: bytes, cuts: list[int], work: Path) -> list[dict]:
    from tracekit.ingest import ingest

    ends = event_end_offsets(text)
    rows = []
    for k, cut in enumerate(cuts):
        d = work / f"cut{k}"
        d.mkdir(parents=True)
        (d / "rank0.json").write_bytes(text[:cut])
        truth = bisect.bisect_right(ends, cut)  # events whose last byte is before the cut
        t = time.perf_counter()
        try:
            ingest(str(d), str(d / ".store"), jobs=1, progress=False)
            m = json.loads((d / ".store" / "manifest.json").read_text())["sources"]["rank0.json"]
            got, lost, err = m["event_count"], m["lost_event_count"], ""
        except Exception as e:  # an error is a 0% recovery for this cut, reported as such
            got, lost, err = 0, None, f"{type(e).__name__}: {e}"[:200]
        rows.append({"cut": cut, "cut_frac": round(cut / len(text), 4), "complete_before_cut": truth,
                     "recovered": got, "reported_lost": lost, "error": err, "s": round(time.perf_counter() - t, 2)})
        shutil.rmtree(d, ignore_errors=True)
    return rows


def seeded_cuts(text: bytes, n: int, seed) -> list[int]:
    rng = random.Random(seed)
    start = text.index(b'"traceEvents"')
    return sorted(rng.randrange(start, len(text)) for _ in range(n))


def recovery(rows: list[dict]) -> float:
    truth = sum(r["complete_before_cut"] for r in rows)
    return 100.0 * sum(min(r["recovered"], r["complete_before_cut"]) for r in rows) / truth if truth else 100.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--cuts", type=int, default=20)
    ap.add_argument("--seed", default="0")
    args = ap.parse_args()
    raw = Path(args.trace).read_bytes()
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    total = len(event_end_offsets(text))
    print(f"{args.trace}: {len(text)} bytes, {total} events")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(text, seeded_cuts(text, args.cuts, args.seed), Path(tmp))
    over = 0
    print(f"{'cut':>10s} {'frac':>6s} {'complete':>9s} {'recovered':>9s} {'lost(rep)':>9s}  error")
    for r in rows:
        over += max(0, r["recovered"] - r["complete_before_cut"])
        print(f"{r['cut']:10d} {r['cut_frac']:6.3f} {r['complete_before_cut']:9d} {r['recovered']:9d} "
              f"{str(r['reported_lost']):>9s}  {r['error']}")
    pct = recovery(rows)
    exact = sum(r["recovered"] == r["complete_before_cut"] for r in rows)
    print(json.dumps({"trace": args.trace, "cuts": len(rows), "events_total": total,
                      "complete_before_cuts": sum(r["complete_before_cut"] for r in rows),
                      "recovered": sum(r["recovered"] for r in rows), "recovery_pct": round(pct, 4),
                      "cuts_exact": exact, "over_count": over, "errors": sum(bool(r["error"]) for r in rows)}))


if __name__ == "__main__":
    main()
