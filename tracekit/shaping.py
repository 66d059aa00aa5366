"""The token bucket the testbed shapes its links with (tc tbf), one definition for the testbed that sets it
(tracekit.testbed) and the replay that models it (replay/model_steps.py): the bucket's depth at a rate, and what a
run.json's testbed block says of its links' buckets."""
from __future__ import annotations

MTU = 9000
FRAME_BYTES = MTU + 14  # what tbf counts of one frame (the Ethernet header included)
# tbf drops a packet larger than its bucket: two frames, and half a millisecond of traffic. Bulk TCP both
# ways at once through this (2 MB each way, 2026-12-03): 99.8 / 99.8 / 99.6 / 99.1% of 50 / 100 / 200 /
# 400 Mbit/s. Before, 1500-byte frames in 64 KiB GSO batches needed a 64 KiB bucket, and 4 ms of traffic
# (with 1 ms TCP got 78% of 400 Mbit/s): 97.5 / 96.9 / 99.9 / 103.8% of the same rates, and 1500-byte
# frames without GSO got 74% of 400 Mbit/s (the CPU per packet).
MIN_BURST_BYTES = 2 * FRAME_BYTES
BURST_S = 0.0005
# frames kind -> (MTU, largest packet tbf sees, smallest bucket): jumbo frames one by one (two of them), or
# 1500-byte frames in GSO batches (a batch and two frames)
FRAMES = {"jumbo": (MTU, MTU, MIN_BURST_BYTES), "gso": (1500, 65536, 65536 + 2 * (1500 + 14))}
GSO_BURST_S = 0.004  # the bucket the GSO kind gets by default: 4 ms of traffic (TCP got 78% of 400 Mbit/s with 1)


def min_burst_bytes(frames: str) -> int:
    """The smallest token bucket a kind of frames passes through: tbf drops a packet larger than its bucket."""
    return FRAMES[frames][2]


def burst_bytes(frames: str, rate_mbit: float, given: int | None) -> int:
    """The token bucket's depth: the one given, else the kind's default (two jumbo frames and half a millisecond
    of traffic; a GSO batch, two frames and 4 ms)."""
    if given is not None:
        return int(given)
    per_s = GSO_BURST_S if frames == "gso" else BURST_S
    return max(min_burst_bytes(frames), int(rate_mbit * 1e6 / 8 * per_s))


def bucket_of(bed: dict):
    """(depth in bytes, depth at a rate: rate_mbit -> bytes, the run's rate in Mbit/s) of the hosts' links' token
    bucket, from run.json's testbed block (bed), or None where it says none. A bucket of the testbed's default for
    its frames (burst_bytes with none given) takes that rule's depth at another rate; one given (--link-burst-kb)
    keeps its depth. The shallowest link's, at the slowest link's rate (a ring's slowest)."""
    try:
        got = [(float(x["rate_mbit"]), int(x["burst_bytes"])) for x in bed["links"]
               if x.get("rate_mbit") is not None and x.get("burst_bytes") is not None]
    except (KeyError, TypeError, ValueError):
        return None
    frames = bed.get("frames")
    if not got or frames not in FRAMES:
        return None
    rate = min(r for r, _ in got)
    depth = min(b for _, b in got)
    if all(b == burst_bytes(frames, r, None) for r, b in got):
        return depth, lambda rate_mbit: burst_bytes(frames, rate_mbit, None), rate
    return depth, lambda rate_mbit: depth, rate
