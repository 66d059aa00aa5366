"""Time gloo all-reduces between testbed hosts: the check that a shaped link runs at its rate.

`run_on_testbed` starts one rank per host (`ip netns exec`), each running `main()` below, and
returns each iteration's time as the slowest rank saw it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

from ..errors import TracekitError

PORT = 29511


def ring_allreduce_model_s(nbytes: int, ranks: int, rate_mbit: float) -> float:
    """Bandwidth-only ring all-reduce time: each link end carries 2(p-1)/p of the buffer."""
    return 2 * (ranks - 1) / ranks * nbytes * 8 / (rate_mbit * 1e6)


def run_on_testbed(tb, nbytes: int, iters: int = 3, warmup: int = 1, timeout_s: float = 120) -> list[int]:
    """Per-iteration all-reduce time in ns (max over ranks), one rank per testbed host."""
    world = len(tb.hosts)
    master = tb.hosts[0].ip
    commands = [(h.index, [sys.executable, "-m", "tracekit.capture.allreduce_probe", "--rank", str(h.index),
                           "--world", str(world), "--master-addr", master, "--port", str(PORT),
                           "--bytes", str(nbytes), "--iters", str(iters), "--warmup", str(warmup)])
                for h in tb.hosts]
    results = []
    for rank, (code, out, err) in enumerate(tb.run_all(commands, timeout_s=timeout_s)):
        if code != 0:
            raise TracekitError(f"all-reduce probe rank {rank} failed (exit {code}): {_last_line(err)}")
        results.append(json.loads(out.strip().splitlines()[-1])["times_ns"])
    return [max(r[i] for r in results) for i in range(iters)]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of a gloo all-reduce timing probe")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--port", type=int, default=PORT)
    ap.add_argument("--bytes", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args(argv)

    from ._torch import require_torch

    torch = require_torch()
    dist = torch.distributed
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master_addr}:{a.port}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    buf = torch.ones(a.bytes // 4, dtype=torch.float32)
    times = []
    for i in range(a.warmup + a.iters):
        dist.barrier()
        t = time.perf_counter_ns()
        dist.all_reduce(buf)
        if i >= a.warmup:
            times.append(time.perf_counter_ns() - t)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "times_ns": times}))


if __name__ == "__main__":
    main()
