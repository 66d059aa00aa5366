"""Dedicated fuzz run of ingest: N seeded mutations of tiny and real traces.

    python bench/fuzz.py --cases 10000 [--shards 2] [--seed 0] [--timeout 120]

Each case (tests/test_fuzz_ingest.py:make_case) is ingested in-process by a shard
worker and must give a valid store or one clear error naming a file
(check_dir). A failing input is saved to tests/fuzz/ (replayed by test_corpus).
Hang guard: each case runs under a SIGALRM watchdog and, as a backstop for code
that never returns to Python, faulthandler kills the shard after 2x the timeout;
the parent records that case as a hang, saves it, and restarts the shard after it.
Prints counts by mutation and outcome, and a JSON summary line.
"""
from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shard_main(args) -> None:
    from tests import test_fuzz_ingest as fz

    fz.CASE_TIMEOUT = args.timeout
    out = open(args.out, "a", buffering=1)
    for i in range(args.start, args.cases, args.of):
        if i < args.resume_after:
            continue
        kind, src, files = fz.make_case(args.seed, i)
        out.write(json.dumps({"start": i}) + "\n")
        faulthandler.dump_traceback_later(2 * args.timeout, exit=True)
        d = Path(tempfile.mkdtemp(prefix=f"fz{i}_"))
        t = time.perf_counter()
        try:
            for name, data in files.items():
                (d / name).write_bytes(data)
            outcome, msg = fz.check_dir(d, list(files)), ""
        except BaseException as e:  # anything but ok/error is a finding
            outcome, msg = "FAIL", "".join(traceback.format_exception_only(type(e), e)).strip()[:2000]
            fz.save_to_corpus(files, f"{kind}-{src}-seed{args.seed}-case{i}")
        finally:
            faulthandler.cancel_dump_traceback_later()
            shutil.rmtree(d, ignore_errors=True)
        out.write(json.dumps({"i": i, "kind": kind, "src": src, "outcome": outcome, "msg": msg,
                              "s": round(time.perf_counter() - t, 3)}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--shards", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", default="0")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--log", default=None, help="JSON-lines log of every case (default: a temp file)")
    ap.add_argument("--shard", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--resume-after", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shard:
        return shard_main(args)

    from tests import test_fuzz_ingest as fz

    log_dir = Path(args.log).parent if args.log else Path(tempfile.mkdtemp(prefix="tkfuzz_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    hangs = []
    logs = [log_dir / f"shard{k}.jsonl" for k in range(args.shards)]
    for p in logs:
        p.write_text("")
    resume = [0] * args.shards
    while True:
        procs = []
        for k in range(args.shards):
            if resume[k] is None:
                continue
            cmd = [sys.executable, __file__, "--shard", "--cases", str(args.cases), "--seed", args.seed,
                   "--timeout", str(args.timeout), "--start", str(k), "--of", str(args.shards),
                   "--resume-after", str(resume[k]), "--out", str(logs[k])]
            procs.append((k, subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)))
        for k, p in procs:
            _, err = p.communicate()
            if p.returncode == 0:
                resume[k] = None
                continue
            # died (hang backstop or a crash): the last started case without a result is the culprit
            started = [json.loads(x) for x in logs[k].read_text().splitlines() if x.strip()]
            last = [x["start"] for x in started if "start" in x][-1]
            kind, src, files = fz.make_case(args.seed, last)
            fz.save_to_corpus(files, f"{kind}-{src}-seed{args.seed}-case{last}")
            hangs.append({"i": last, "kind": kind, "rc": p.returncode, "stderr": err[-2000:]})
            with open(logs[k], "a") as f:
                f.write(json.dumps({"i": last, "kind": kind, "src": src, "outcome": "HANG_OR_CRASH",
                                    "msg": err[-500:]}) + "\n")
            resume[k] = last + 1
        if all(r is None for r in resume):
            break
    rows = [json.loads(x) for p in logs for x in p.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "outcome" in r]
    by = collections.Counter((r["kind"], r["outcome"]) for r in rows)
    outcomes = collections.Counter(r["outcome"] for r in rows)
    srcs = collections.Counter(r["src"] for r in rows)
    wall = time.perf_counter() - t0
    kinds = sorted({k for k, _ in by})
    print(f"{'mutation':24s} {'cases':>6s} {'ok':>6s} {'error':>6s} {'FAIL':>5s} {'HANG':>5s}")
    for k in kinds:
        n = sum(v for (kk, _), v in by.items() if kk == k)
        print(f"{k:24s} {n:6d} {by[(k, 'ok')]:6d} {by[(k, 'error')]:6d} {by[(k, 'FAIL')]:5d} "
              f"{by[(k, 'HANG_OR_CRASH')]:5d}")
    for r in rows:
        if r["outcome"] not in ("ok", "error"):
            print("FINDING", r["i"], r["kind"], r["src"], r["outcome"], r["msg"][:300])
    summary = {"cases": len(rows), "outcomes": dict(outcomes), "sources": dict(srcs), "seed": args.seed,
               "wall_s": round(wall, 1), "max_case_s": max((r.get("s", 0) for r in rows), default=0),
               "log_dir": str(log_dir)}
    print(json.dumps(summary))
    sys.exit(0 if outcomes.keys() <= {"ok", "error"} else 1)


if __name__ == "__main__":
    main()
