"""Run the 2-rank demo trainer again and again and count the runs that abort.

    python scripts/demo_soak.py --runs 50            # exit 1 if any run aborted
    python scripts/demo_soak.py --mechanism 10       # the race itself, with and without end_process

The demo used to abort now and then at process exit (tracekit/capture/teardown.py has the cause); this is
the evidence that it no longer does. --mechanism reproduces the race on purpose: each rank leaves a
gloo all-reduce in flight (DDP keeps the group alive past destroy_process_group) and then either returns
normally (the interpreter tears down while the worker thread still holds the tensors) or ends with
tracekit.capture.end_process.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def soak(runs: int) -> int:
    from tracekit.capture.demo import DemoConfig, run
    from tracekit.errors import TracekitError

    aborted = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            t = time.perf_counter()
            try:  # the configuration of tests/test_capture.py's 2-rank capture
                run(DemoConfig(out_dir=os.path.join(tmp, "ddp2"), ranks=2, steps=2, warmup=1, timed_steps=1,
                               d_model=32, layers=1, vocab=128, seq_len=16, batch_size=4))
                print(f"run {i + 1:3d}: ok ({time.perf_counter() - t:.1f} s)", flush=True)
            except TracekitError as e:
                aborted += 1
                print(f"run {i + 1:3d}: FAILED: {e}", flush=True)
    print(f"{runs - aborted} of {runs} runs completed, {aborted} aborted")
    return 1 if aborted else 0


def _race_rank(rank: int, port: int, clean_exit: bool) -> None:
    import torch
    import torch.distributed as dist

    from tracekit.capture import end_process

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))  # keeps the group alive  # noqa: F841
    work = dist.all_reduce(torch.ones(4_000_000), async_op=True)  # still running when the rank returns  # noqa: F841
    dist.destroy_process_group()
    if clean_exit:
        end_process(0)


def mechanism(runs: int) -> int:
    import torch.multiprocessing as mp

    for clean in (False, True):
        aborted = 0
        for _ in range(runs):
            try:
                mp.spawn(_race_rank, args=(_free_port(), clean), nprocs=2)
            except mp.ProcessExitedException:
                aborted += 1
        how = "end_process" if clean else "normal return"
        print(f"collective in flight at exit, {how}: {aborted} of {runs} runs aborted", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50, help="demo runs (default 50)")
    ap.add_argument("--mechanism", type=int, metavar="N", help="instead: N runs of the race, each way")
    a = ap.parse_args(argv)
    return mechanism(a.mechanism) if a.mechanism else soak(a.runs)


if __name__ == "__main__":
    sys.exit(main())
