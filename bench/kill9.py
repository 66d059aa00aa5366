"""kill -9 at random moments during `tracekit ingest` (seeded), N trials.

    python bench/kill9.py [--trials 50] [--seed 0]

Trace dir (in a temp dir): a copy of sample_traces/ddp4_loopback (4 ranks with
flight-recorder dumps) plus, when ../shared/traces is present, the real
hta/critical_path simple_add and alexnet traces as ranks 4 and 5.
The "previous" store is an ingest of the same dir with rank 0 replaced by
other content and rank 3 absent, so an interrupted run has real work to do
(replace, add) on top of a committed store. Each trial restores that previous
store, starts `tracekit ingest` as a subprocess, SIGKILLs it after a random delay
in [0, 1.3 x the uninterrupted ingest time], then checks:
  - the store reads and its dump (every table, every column, sorted) equals
    either the previous store's or the finished store's (never a mix), and
    equals the previous one whenever the manifest was not replaced;
  - a re-run (incremental, no --force) completes to a dump identical to an
    uninterrupted ingest's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "traces" / "hta" / "critical_path"


def store_dump(store: Path) -> str:
    """A digest of every table of the store: all columns, rows sorted."""
    from tracekit.store import Store
    from tracekit.store.schema import TABLES

    con = Store(str(store)).connect()
    h = hashlib.sha256()
    for t in sorted(TABLES):
        try:
            rows = con.sql(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
        except Exception as e:  # a table this store has no files for
            if "does not exist" not in str(e) and "not found" not in str(e).lower():
                raise
            rows = None
        h.update(f"{t}:{rows!r}\n".encode())
    return h.hexdigest()


def build_dir(d: Path) -> None:
    src = ROOT / "sample_traces" / "ddp4_loopback"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns(".tracekit"))
    for rank, sub in ((4, "simple_add"), (5, "alexnet")):
        files = sorted((SHARED / sub).glob("*.json.gz")) if SHARED.exists() else []
        if files:
            shutil.copy(files[0], d / f"rank{rank}.trace.json.gz")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", default="0")
    args = ap.parse_args()
    from tracekit.ingest import ingest

    rng = random.Random(args.seed)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "tracekit.cli", "ingest"] if (ROOT / "tracekit" / "cli" / "__main__.py").exists() \
        else [sys.executable, "-c", "import sys; from tracekit.cli import main; sys.argv[0]='tracekit'; main()", "ingest"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        d = tmp / "run"
        build_dir(d)
        # the finished store: an uninterrupted ingest
        t = time.perf_counter()
        ingest(str(d), str(tmp / "ref"), rank_from="filename", progress=False)
        full_s = time.perf_counter() - t
        ref = store_dump(tmp / "ref")
        # the previous store: rank 0 other content, rank 3 absent
        (d / "rank3.trace.json.gz").rename(tmp / "rank3.trace.json.gz")
        (d / "rank0.trace.json.gz").rename(tmp / "rank0.trace.json.gz")
        shutil.copy(d / "rank1.trace.json.gz", d / "rank0.trace.json.gz")
        ingest(str(d), str(tmp / "prev"), rank_from="filename", progress=False)
        prev = store_dump(tmp / "prev")
        (tmp / "rank3.trace.json.gz").rename(d / "rank3.trace.json.gz")
        os.replace(tmp / "rank0.trace.json.gz", d / "rank0.trace.json.gz")
        assert prev != ref
        print(f"{len(list(d.iterdir()))} files; uninterrupted ingest {full_s:.2f} s (in-process)")
        counts = {"trials": 0, "prev_unchanged": 0, "finished_before_kill": 0, "mixed_or_unreadable": 0,
                  "rerun_identical": 0, "rerun_differs": 0, "staging_left_after_rerun": 0}
        for k in range(args.trials):
            store = tmp / "s"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(tmp / "prev", store)
            manifest = (store / "manifest.json").read_bytes()
            delay = rng.uniform(0, 1.3 * (full_s + 1.0))  # +1 s: the CLI's interpreter start-up
            p = subprocess.Popen(cli + [str(d), "--store", str(store), "--rank-from", "filename"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            rc = p.wait()
            counts["trials"] += 1
            try:
                now = store_dump(store)
            except Exception as e:
                now = f"unreadable: {e}"
            same_manifest = (store / "manifest.json").read_bytes() == manifest
            if same_manifest and now == prev:
                counts["prev_unchanged"] += 1
                state = "previous"
            elif not same_manifest and now == ref:
                counts["finished_before_kill"] += 1
                state = "finished"
            else:
                counts["mixed_or_unreadable"] += 1
                state = f"BAD ({now[:80]})"
            ingest(str(d), str(store), rank_from="filename", progress=False)
            ok = store_dump(store) == ref
            counts["rerun_identical" if ok else "rerun_differs"] += 1
            counts["staging_left_after_rerun"] += (store / "staging").exists()
            print(f"trial {k:2d}: kill after {delay:5.2f} s (rc {rc}): store {state}; re-run "
                  f"{'identical' if ok else 'DIFFERS'}", flush=True)
    print(json.dumps(counts))
    sys.exit(0 if counts["mixed_or_unreadable"] == counts["rerun_differs"] == 0 else 1)


if __name__ == "__main__":
    main()
