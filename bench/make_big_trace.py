"""Make one large Kineto trace by repeating the steps of a real one.

    python bench/make_big_trace.py OUT.json.gz --size-gb 2 [--src DIR_OR_FILE] [--level 1]

The source (default ../shared/traces/hta/df_index_resolver, one rank, 54 MB
uncompressed) is copied back to back until the output reaches --size-gb of
uncompressed JSON. Copy k is shifted so that it stays a plausible trace:

- timestamps by k x (the source's span + 1 ms), so copies follow each other;
- correlation, External id, Sequence number and the flow ids (s/f `id`) by
  k x (largest id + 1), so every launch -> kernel link stays unique;
- ProfilerStep#N becomes ProfilerStep#(N + k x number of steps);
- metadata events (ph M) and the profiler's own span rows appear once;
- the last copy stops at the first 4096-event block boundary past the size
  (its flows may then lack their other end, as in a trace cut by the profiler).

The top-level keys (distributedInfo, deviceProperties, ...) are the source's.
Written streaming (gzip through ISA-L when available): memory stays at the
size of the decoded source, whatever --size-gb.
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import sys

import msgspec

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = os.path.join(HERE, "..", "..", "shared", "traces", "hta", "df_index_resolver")
_ID_ARGS = ("correlation", "External id", "Sequence number")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _source_file(src: str) -> str:
    if os.path.isdir(src):
        files = sorted(f for f in os.listdir(src) if f.endswith((".json", ".json.gz")))
        if not files:
            raise SystemExit(f"{src}: no *.json / *.json.gz trace in it")
        return os.path.join(src, files[0])
    return src


def _open_out(path: str, level: int):
    if not path.endswith(".gz"):
        return open(path, "wb")
    try:
        from isal import igzip

        return igzip.open(path, "wb", compresslevel=min(level, 3))
    except ImportError:  # pragma: no cover
        return gzip.open(path, "wb", compresslevel=level)


def make_big_trace(out: str, size_bytes: int, src: str = DEFAULT_SRC, level: int = 1) -> dict:
    """Write the trace; return {"bytes": uncompressed size, "copies": n, "events": n}."""
    path = _source_file(src)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = msgspec.json.decode(raw)
    del raw
    events = doc.pop("traceEvents")
    once = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace" or
            (e.get("ph") == "i" and e.get("cat") is None)]
    repeated = [e for e in events if not (e.get("ph") == "M" or e.get("cat") == "Trace" or
                                          (e.get("ph") == "i" and e.get("cat") is None))]
    ts = [e["ts"] for e in repeated if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in repeated if isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur", 0), (int, float))]
    period = (max(ends) - min(ts)) + 1000  # us: copies 1 ms apart
    ids = [0]
    steps = []
    for e in repeated:
        a = e.get("args")
        if isinstance(a, dict):
            ids.extend(a[k] for k in _ID_ARGS if isinstance(a.get(k), int))
        if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
            ids.append(e["id"])
        m = _STEP.match(str(e.get("name", "")))
        if m:
            steps.append(int(m.group(1)))
    id_stride = max(ids) + 1
    step_stride = (max(steps) - min(steps) + 1) if steps else 0

    enc = msgspec.json.Encoder()
    head = enc.encode({k: v for k, v in doc.items()})
    written = 0
    copies = 0
    n_events = 0
    with _open_out(out, level) as f:
        def put(b: bytes) -> None:
            nonlocal written
            f.write(b)
            written += len(b)

        put(head[:-1] + (b', "traceEvents": [' if len(head) > 2 else b'{"traceEvents": ['))
        first = True
        while copies == 0 or written < size_bytes:
            k = copies
            batch = []
            for e in (once + repeated) if k == 0 else repeated:
                if k:
                    e = dict(e)
                    if isinstance(e.get("ts"), int):
                        e["ts"] = e["ts"] + k * period
                    elif isinstance(e.get("ts"), float):  # Kineto writes ns: 3 decimals, keep it so
                        e["ts"] = round(e["ts"] + k * period, 3)
                    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
                        e["id"] = e["id"] + k * id_stride
                    a = e.get("args")
                    if isinstance(a, dict) and any(x in a for x in _ID_ARGS):
                        a = dict(a)
                        for x in _ID_ARGS:
                            if isinstance(a.get(x), int) and a[x] >= 0:
                                a[x] = a[x] + k * id_stride
                        e["args"] = a
                    m = _STEP.match(e.get("name", "")) if isinstance(e.get("name"), str) else None
                    if m:
                        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
                batch.append(e)
            # the last copy stops at the event that reaches the size
            for i in range(0, len(batch), 4096):
                if k and written >= size_bytes:
                    break
                body = enc.encode(batch[i:i + 4096])[1:-1]
                put(body if first else b"," + body)
                first = False
                n_events += len(batch[i:i + 4096])
            copies += 1
        put(b"]}")
    return {"bytes": written, "copies": copies, "events": n_events}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output trace (.json or .json.gz)")
    ap.add_argument("--size-gb", type=float, default=2.0, help="uncompressed size to reach (default 2)")
    ap.add_argument("--src", default=DEFAULT_SRC, help="source trace file or directory")
    ap.add_argument("--level", type=int, default=1, help="gzip level (default 1: fast)")
    a = ap.parse_args()
    if not os.path.exists(a.src):
        print(f"{a.src}: not found (the shared traces live beside the repo)", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    r = make_big_trace(a.out, int(a.size_gb * 1e9), a.src, a.level)
    print(f"{a.out}: {r['bytes'] / 1e6:.1f} MB uncompressed, {r['copies']} copies, {r['events']} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
