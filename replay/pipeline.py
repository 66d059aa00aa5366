"""Pipeline schedules on the engine: the makespan of one step of GPipe or 1F1B over stages whose micro-batch
forward and backward times and stage-to-stage transfers are given (the re-layout what-if, replay/relayout.py,
gives them from the traces)."""
from __future__ import annotations

import numpy as np

from tracekit.capture.pipeline_demo import schedule as schedule_1f1b  # the 1F1B order the recorder runs

from .engine import Engine


def gpipe_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """GPipe's order on every stage: all the forwards, then all the backwards (torch.distributed.pipelining's
    ScheduleGPipe: the backwards in micro-batch order)."""
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]


def pipeline_makespan(f_ns, b_ns, p2p_ns: int, micro_batches: int, schedule: str = "1f1b") -> int:
    """Makespan of one pipeline step under schedule ("1f1b" | "gpipe"), replayed by the engine: each stage runs
    its program order, a micro-batch's forward waits for its activation from the previous stage and its backward
    for the gradient from the next, each transfer p2p_ns, one at a time each way between two stages."""
    order_of = {"1f1b": schedule_1f1b, "gpipe": gpipe_order}[schedule]
    P, m = len(f_ns), int(micro_batches)
    if P < 1 or m < 1:
        raise ValueError("need at least one stage and one micro-batch")
    ids = {}
    n = 1  # node 0 is the origin
    dur = [0]
    for s in range(P):
        for i in range(m):
            for kind, d in (("F", f_ns[s]), ("B", b_ns[s])):
                ids[(kind, s, i)] = n
                dur.append(int(d))
                n += 1
            if s < P - 1:
                for kind in ("SF", "SB"):  # forward activation s -> s+1, gradient s+1 -> s
                    ids[(kind, s, i)] = n
                    dur.append(int(p2p_ns))
                    n += 1
    src, dst = [], []

    def edge(a, b):
        src.append(a)
        dst.append(b)

    for s in range(P):
        order = order_of(s, P, m)
        prev = 0
        for kind, i in order:  # the stage's program order
            edge(prev, ids[(kind, s, i)])
            prev = ids[(kind, s, i)]
        for i in range(m):
            if s < P - 1:
                edge(ids[("F", s, i)], ids[("SF", s, i)])
                edge(ids[("SF", s, i)], ids[("F", s + 1, i)])
                edge(ids[("B", s + 1, i)], ids[("SB", s, i)])
                edge(ids[("SB", s, i)], ids[("B", s, i)])
                if i > 0:  # a link carries one message at a time, in the order they were sent
                    edge(ids[("SF", s, i - 1)], ids[("SF", s, i)])
                    edge(ids[("SB", s, i - 1)], ids[("SB", s, i)])
            else:
                edge(ids[("F", s, i)], ids[("B", s, i)])
    for key, node in ids.items():  # transfers hang off the origin too (their real deps follow)
        if key[0] in ("SF", "SB"):
            edge(0, node)
    e = Engine(n, src, dst, np.ones(len(src), bool), np.zeros(len(src), np.int64), source=0, t0_ns=0)
    sched = e.run(np.asarray(dur, np.int64))
    return int(sched.end_ns.max())
