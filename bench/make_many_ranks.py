"""Make a trace set of N ranks from the bundled 4-rank gloo sample.

    python bench/make_many_ranks.py N OUT_DIR [--src sample_traces/ddp4_loopback] [--seed 0] [--jitter-us 400]

Rank r is a copy of sample rank r % 4 (CPU-only gloo DDP: c10d::allreduce_ / broadcast_ calls on the
main thread, gloo:* annotations on the pt_gloo_runloop threads), re-timed so that the N ranks form
one plausible job:

- every collective ends at the same time on every rank (the end of sample rank 0's), while each
  rank's arrival (the c10d call's start) is jittered by up to --jitter-us (bounded so that the
  order of events never changes);
- between those points time is stretched piecewise-linearly, so the durations of the other ops are
  jittered too, nesting and order on every thread stay intact, and flows keep their ids;
- distributedInfo says rank r of world_size N with one process group of all N ranks; the host name
  is node<r // 8> (8 ranks per host).

The collectives therefore match across ranks by order (gloo has no sequence numbers in the trace),
as tracekit comms collectives pairs them. Timestamps are written as exact ns (3 decimals of us).
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys

import msgspec
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = os.path.join(os.path.dirname(HERE), "sample_traces", "ddp4_loopback")


def _load(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read()
    return msgspec.json.decode(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


class _Template:
    """One sample rank: its events pre-encoded without ts/dur, their times as arrays, its collectives."""

    def __init__(self, doc: dict):
        self.doc = {k: v for k, v in doc.items() if k != "traceEvents"}
        base = int(doc.get("baseTimeNanoseconds") or 0)
        self.base_us = base / 1000.0
        enc = msgspec.json.Encoder()
        self.prefix: list[bytes] = []
        ts, end, has_ts, has_dur = [], [], [], []
        for e in doc["traceEvents"]:
            t = e.get("ts")
            d = e.get("dur")
            num_t = isinstance(t, (int, float)) and not isinstance(t, bool)
            num_d = num_t and isinstance(d, (int, float)) and not isinstance(d, bool)
            rest = {k: v for k, v in e.items() if not ((k == "ts" and num_t) or (k == "dur" and num_d))}
            self.prefix.append(enc.encode(rest)[:-1])
            has_ts.append(num_t)
            has_dur.append(num_d)
            ts.append(float(t) if num_t else 0.0)
            end.append(float(t) + float(d) if num_d else 0.0)
        self.ts = np.array(ts)
        self.end = np.array(end)
        self.has_ts = np.array(has_ts)
        self.has_dur = np.array(has_dur)
        # collectives in order: (arrival = call start, end = max(call end, runloop end)), paired by op order
        calls: dict[str, list] = {}
        runs: dict[str, list] = {}
        for e in doc["traceEvents"]:
            name = e.get("name") or ""
            if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)):
                continue
            op = name.split("::", 1)[-1].rstrip("_").replace("allreduce", "all_reduce") if name.startswith("c10d::") \
                else name.split(":", 1)[-1] if name.startswith("gloo:") else None
            if op is None:
                continue
            (calls if name.startswith("c10d::") else runs).setdefault(op, []).append(
                (float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0)))
        colls = []
        for op, cs in calls.items():
            rs = sorted(runs.get(op, []))
            for i, (s, ce) in enumerate(sorted(cs)):
                colls.append((s, max(ce, rs[i][1]) if i < len(rs) else ce))
        self.collectives = sorted(colls)


def _knots(tpl: _Template, ref: _Template, rng: np.random.Generator, jitter_us: float):
    """Piecewise-linear map from tpl's clock to the job's clock (ref's): each collective's end is a
    fixed point (all ranks finish together); its arrival moves by a bounded random amount."""
    n = min(len(tpl.collectives), len(ref.collectives))
    xs, ys = [], []
    prev_y = -np.inf
    prev_x = -np.inf
    for c in range(n):
        s_t, e_t = (v + tpl.base_us for v in tpl.collectives[c])
        s_r, e_r = (v + ref.base_us for v in ref.collectives[c])
        lo = -0.4 * (s_r - prev_y) if np.isfinite(prev_y) else -jitter_us
        hi = 0.4 * (e_r - s_r)
        delta = float(np.clip(rng.uniform(-jitter_us, jitter_us), lo, hi))
        for x, y in ((s_t, s_r + delta), (e_t, e_r)):
            if x > prev_x and y > prev_y:  # keep the map increasing (drops a knot the sample cannot honour)
                xs.append(x)
                ys.append(y)
                prev_x, prev_y = x, y
    if not xs:
        off = rng.uniform(-jitter_us, jitter_us)
        return np.array([0.0, 1.0]), np.array([off, off + 1.0])
    big = 1e12  # slope 1 before the first and after the last knot
    return np.array([xs[0] - big] + xs + [xs[-1] + big]), np.array([ys[0] - big] + ys + [ys[-1] + big])


def _us(ns: np.ndarray) -> list[bytes]:
    return [f"{v // 1000}.{v % 1000:03d}".encode() if v >= 0 else f"-{(-v) // 1000}.{(-v) % 1000:03d}".encode()
            for v in ns.tolist()]


def write_rank(tpl: _Template, ref: _Template, rank: int, world: int, out: str, rng: np.random.Generator,
               jitter_us: float) -> int:
    kx, ky = _knots(tpl, ref, rng, jitter_us)
    # everything on ref's clock, written relative to ref's base, in exact ns
    ts_ns = np.rint((np.interp(tpl.ts + tpl.base_us, kx, ky) - ref.base_us) * 1000).astype(np.int64)
    end_ns = np.rint((np.interp(tpl.end + tpl.base_us, kx, ky) - ref.base_us) * 1000).astype(np.int64)
    dur_ns = np.maximum(end_ns - ts_ns, 0)
    ts_s, dur_s = _us(ts_ns), _us(dur_ns)
    parts = []
    for i, pre in enumerate(tpl.prefix):
        b = pre
        if tpl.has_ts[i]:
            b += (b"," if len(pre) > 1 else b"") + b'"ts":' + ts_s[i]
            if tpl.has_dur[i]:
                b += b',"dur":' + dur_s[i]
        parts.append(b + b"}")
    doc = dict(ref.doc)
    info = dict(doc.get("distributedInfo") or {})
    info.update({"backend": info.get("backend", "gloo"), "rank": rank, "world_size": world})
    pg = dict((info.get("pg_config") or [{}])[0])
    pg.update({"pg_name": pg.get("pg_name", "0"), "pg_desc": pg.get("pg_desc", "default_pg"), "pg_size": world,
               "ranks": list(range(world))})
    info["pg_config"] = [pg]
    info["pg_count"] = 1
    doc["distributedInfo"] = info
    doc["host_name"] = f"node{rank // 8}"
    doc["traceName"] = f"rank{rank}.trace.json"
    head = msgspec.json.encode(doc)
    body = head[:-1] + b',"traceEvents":[' + b",".join(parts) + b"]}"
    with open(out, "wb") as f:
        f.write(gzip.compress(body, compresslevel=1))
    return len(parts)


def make_many_ranks(n: int, out_dir: str, src: str = DEFAULT_SRC, seed: int = 0, jitter_us: float = 400.0) -> int:
    names = sorted(f for f in os.listdir(src) if f.endswith((".trace.json.gz", ".trace.json")))
    if not names:
        raise SystemExit(f"{src}: no rank*.trace.json[.gz] in it")
    tpls = [_Template(_load(os.path.join(src, f))) for f in names]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    total = 0
    for r in range(n):
        total += write_rank(tpls[r % len(tpls)], tpls[0], r, n, os.path.join(out_dir, f"rank{r}.trace.json.gz"),
                            rng, jitter_us)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, help="number of ranks")
    ap.add_argument("out_dir")
    ap.add_argument("--src", default=DEFAULT_SRC, help="directory of sample rank traces")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jitter-us", type=float, default=400.0, help="largest arrival jitter (us)")
    a = ap.parse_args()
    if a.n < 1:
        print("N must be at least 1", file=sys.stderr)
        return 2
    events = make_many_ranks(a.n, a.out_dir, a.src, a.seed, a.jitter_us)
    print(f"{a.out_dir}: {a.n} ranks, {events} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
