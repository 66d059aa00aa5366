"""Calibrating the shared-link model (replay/links.py) on the run's own transfers, transfer by transfer.

`fit(lf, starts_ns, measured_ns)` takes the run's collectives as flows over its links, each with its measured
start (the barrier's: the last participant's arrival) and its measured transfer, and returns:

1. **Capacity and latency per link class.** The transfers that had their links to themselves (no other flow in
   flight on a link they cross: links.overlapped) tell the link apart from the sharing: their time is
   latency x steps + bytes / capacity, fitted as the alpha-beta calibration fits a class (replay/calibration.py:
   robust inliers, then least squares weighted by 1 / time). When their sizes cannot tell latency from
   bandwidth (one size, one op), the class takes the latency the other classes' lone transfers give, else none:
   every ns of a lone transfer is then bandwidth (a transfer that one link rate times at 20.0 ms, twice the rate
   at 10.1 ms). A class whose every transfer shared a link (DDP's buckets on gloo's two worker threads) is fitted
   on the links' busy periods instead (`busy_period_fit`). Where the links' nominal rate is known (run.json's tc
   rate, [network] nic_bandwidth_gbps) and the sizes cannot split the time, the class takes that rate and the rest
   of its typical transfer as latency, as far as the link can have that much (`_at_nominal`).
2. **A factor and a tail per transfer.** Each flow's bytes and latency are multiplied by a factor such that
   the flows, replayed from their measured starts and sharing their links under the fitted parameters, each
   take their measured time (rounds of the forward model: a flow that took 10% longer than the model gets 10%
   more to move, and the flows it shared a link with are re-timed with it). What the link model does not say
   of a kind of transfer (gloo's algorithm, protocol overhead, how TCP split a shared link) moves with the link
   as the modelled part does; but no lone transfer keeps more than the median factor of the lone ones of its
   link class and op, and what one took beyond that (a worker thread descheduled, a retransmission) is its
   tail, ns after its bytes have moved, which a faster link does not shrink. With no change every flow takes its
   measured time, as the alpha-beta model's ratio
   mode gives each collective its measured transfer back, and the links share as they did.

Capacities are bytes per ns (1 GB/s = 1 byte/ns), latencies ns.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .engine import Engine, _max_min
from .links import INTER, INTRA, OPTICAL, LinkFlows, LinkParams, busy_periods, overlapped, period_ends
from .calibration import inliers, separable, weighted_fit
from .costs import DEFAULT_LINKS

MIN_LONE = 3                # lone transfers a class needs for the regression (else the busy periods)
# the lone transfers' fit gives way to the busy periods' where those end under it with over twice the loss (in rms,
# 1.4x as far off) of their own fit: BURST_GAIN's bar for a bucket the run shows
LONE_FIT_GAIN = 0.5


@dataclass(frozen=True)
class Fit:
    params: LinkParams
    rel_rms: dict[str, float]   # per link class: root-mean-square relative residual of the fitted model
    flows: dict[str, int]       # per link class: transfers fitted
    source: dict[str, str] = field(default_factory=dict)  # per link class: how it was fitted
    factor: np.ndarray | None = None   # per flow of the fitted LinkFlows: its bytes x this
    tail_ns: np.ndarray | None = None  # per flow: ns after its bytes have moved
    latency_share: np.ndarray | None = None  # per flow: its latency x this (< 1: a transfer shorter than it)
    notes: list = field(default_factory=list)
    shared: np.ndarray | None = None  # per flow: whether it shared a link with another in the run (links.overlapped)
    # the inter-node bucket's depth (bytes) when the links' rate is scaled by x (a known bucket: run.json), or None
    burst_at: Callable[[float], float] | None = None


def transfers(lf: LinkFlows, starts_ns: np.ndarray, prm: LinkParams, factor: np.ndarray | None = None,
              latency_share: np.ndarray | None = None) -> np.ndarray:
    """Each flow's time (ns) when the flows start at starts_ns (their measured barrier starts) and share
    the links under prm, with nothing else in the replay: the calibration's forward model."""
    n = len(lf)
    if n == 0:
        return np.zeros(0, np.int64)
    starts_ns = np.asarray(starts_ns, np.int64)
    t0 = int(starts_ns.min())
    e = Engine(n + 1, np.zeros(n, np.int64), np.arange(1, n + 1), np.zeros(n, bool), starts_ns - t0, source=0,
               t0_ns=t0)
    s = e.run(np.zeros(n + 1, np.int64), flows=lf.flows(np.arange(1, n + 1), prm, factor, latency_share))
    return s.end_ns[1:] - s.start_ns[1:]


def fit(lf: LinkFlows, starts_ns: np.ndarray, measured_ns: np.ndarray, ops: np.ndarray | None = None,
        latency_bound_ns: dict[str, float] | None = None, frame_bytes: float = 0.0,
        known_burst: dict[str, float] | None = None, nominal: dict[str, float] | None = None) -> Fit:
    """Capacity and latency per link class, and each transfer's factor and tail (the module docstring). ops: each
    flow's op (the factors' groups are link class and op). latency_bound_ns: per link class, the most latency the
    link itself can have (its round trip and one frame's serialization); a fitted latency above it is the link's
    bound and, for the rest, software time per step (LinkParams.overhead_ns): the transfers' times stay the same.
    frame_bytes: the links' frame (MTU); a lone transfer of at most that many bytes per link is not bandwidth beyond
    its serialization (_factors). known_burst: per link class, the depth (bytes) of a token bucket the links are
    known to be shaped with (run.json's testbed block): the class is fitted on its busy periods under it (the
    bucket refilling while its links are idle), and no depth is fitted for it. nominal: per link class, the rate
    (bytes/ns of payload) its links were shaped or sold at: a class whose transfers cannot tell latency from
    bandwidth takes it (_at_nominal)."""
    starts = np.asarray(starts_ns, np.int64)
    measured = np.asarray(measured_ns, np.int64)
    timed = measured > 0
    present = [c for c in (INTER, INTRA) if ((lf.link_class == c) & timed).any()]
    shared = overlapped(lf, starts, starts + measured)
    alone = ~shared & timed
    cap = {INTRA: 1.0, INTER: 1.0}
    lat = {INTRA: 0.0, INTER: 0.0}
    known = {c: float(v) for c, v in (known_burst or {}).items() if v and c in present}
    source, notes = {}, []
    lone_fit, pending, one_size = {}, [], {}  # one_size: per class, the note of a lone fit that sizes cannot split
    for c in present:
        sel = (lf.link_class == c) & alone
        # behind a known bucket a transfer's bytes pass at once as far as the bucket had refilled, which its link's
        # idle time before it says: the busy periods' fit replays that (a lone transfer's own period is itself)
        if sel.sum() >= MIN_LONE and c not in known:
            got = _lone_fit(lf.lat_steps[sel], lf.bytes[sel], measured[sel].astype(np.float64))
            if got is not None:
                lone_fit[c] = got
                continue
        pending.append(c)
    split = [c for c, (_, _, sep, _) in lone_fit.items() if sep]
    for c, (latency, capacity, sep, n) in lone_fit.items():
        if not sep:
            pooled = [lone_fit[o][0] for o in split]
            latency = float(np.mean(pooled)) if pooled else 0.0
            capacity = _capacity_given(lf, (lf.link_class == c) & alone, measured, latency)
            one_size[c] = (f"links model: {c}'s {n} lone transfer(s) are of one size: latency "
                           + (f"{latency / 1e3:.3g} us from the other class" if pooled else
                              "0, every ns of a transfer counted as bandwidth"))
        cap[c], lat[c] = capacity, latency
        source[c] = f"{n} lone transfer(s)"
    periods = _Periods(lf, starts, measured)  # the measured busy periods, read by both fits below
    for c in list(lone_fit):
        # a few lone transfers can fit a line that the rest of the run's transfers deny (behind a bucket nobody
        # told: the lone ones after idle spells pass on its tokens): where the busy periods of all its transfers end
        # far closer to the measured ones under the busy periods' own fit, the class takes that
        alone_prm = LinkParams(dict(cap), dict(lat), burst=dict(known))
        was = periods.loss(c, alone_prm)
        if was <= _GOOD_LOSS:  # the periods end where they did
            continue
        # the cheap look first: a capacity at the lone fit's latency that ends them far closer (a line search), before
        # the busy periods' own fit over latencies
        closer, _ = _best_capacity(lambda cp: periods.loss(c, replace(alone_prm, capacity={**cap, c: cp})), cap[c])
        if closer >= LONE_FIT_GAIN * was:
            continue
        alt = busy_period_fit(lf, starts, measured, classes=[c], start=alone_prm, periods=periods)
        now = periods.loss(c, alt)
        if now < LONE_FIT_GAIN * was:
            notes.append(f"links model: {c}'s {lone_fit[c][3]} lone transfer(s) fitted {cap[c] * 8e3:.4g} Mbit/s and "
                         f"{lat[c] / 1e3:.4g} us per step, which leave its busy periods "
                         f"{100 * was ** 0.5:.0f}% rms off the measured ones; their own fit, "
                         f"{100 * now ** 0.5:.0f}%, is taken")
            cap[c], lat[c] = alt.capacity[c], alt.latency_ns[c]
            one_size.pop(c, None)
            pending.append(c)
            del lone_fit[c]
    if pending:
        prm = busy_period_fit(lf, starts, measured, classes=pending,
                              start=LinkParams(dict(cap), dict(lat), burst=dict(known)), periods=periods)
        for c in pending:
            cap[c], lat[c] = prm.capacity[c], prm.latency_ns[c]
            source[c] = (f"busy periods of {int(((lf.link_class == c) & timed).sum())} "
                         + ("transfer(s)" if c in known else "shared transfer(s)"))
    for c in (INTER, INTRA):
        if c not in present:  # no transfer of the run crossed it: the alpha-beta model's default (a what-if may use it)
            cap[c], lat[c] = DEFAULT_LINKS[c].bandwidth_gbps, DEFAULT_LINKS[c].alpha_ns
            source[c] = "default"
    over = {}
    for c, most in (latency_bound_ns or {}).items():
        if c in present and lat[c] > most:
            over[c] = lat[c] - most
            lat[c] = float(most)
            notes.append(f"links model: {c}'s fitted {(lat[c] + over[c]) / 1e3:.4g} us per latency step is more than "
                         f"the link can take ({most / 1e3:.4g} us: its round trip and one frame): the link gets "
                         f"{most / 1e3:.4g} us, the other {over[c] / 1e3:.4g} us are software per step (a worker "
                         "thread's wake-up, the protocol), which a faster or nearer link does not shorten")
    params = LinkParams(dict(cap), dict(lat), overhead_ns=over, burst=dict(known))
    for c in known:
        source[c] += f", behind the links' {known[c] / 1e3:.0f} KB token bucket (run.json)"
    for c in present:
        if c in known:
            continue
        got = burst_fit(periods, params, c)
        if got is not None:
            depth, capacity, before, after = got
            params = replace(params, capacity={**params.capacity, c: capacity}, burst={**params.burst, c: depth})
            source[c] += (f", behind a {depth / 1e3:.0f} KB token bucket (the busy periods {100 * before ** 0.5:.1f}% "
                          f"rms off without one, {100 * after ** 0.5:.1f}% with it)")
    for c, rate in (nominal or {}).items():
        paced = (lf.link_class == c) & timed & (lf.bytes > frame_bytes)  # beyond one frame: paced by the link
        if c in present and rate > 0 and not separable(lf.lat_steps[paced], lf.bytes[paced]):
            got = _at_nominal(lf, starts, measured, paced & alone, params, c, rate, (latency_bound_ns or {}).get(c))
            if got is not None:
                params, was = got
                source[c] += f", at the NICs' nominal rate"
                one_size[c] = (f"links model: {c}'s transfers are of one size, which cannot tell latency from "
                               f"bandwidth: the link is taken at its nominal {rate * 8e3:.4g} Mbit/s of payload and "
                               f"the rest of the typical transfer is the link's latency, "
                               f"{params.latency_ns[c] / 1e3:.4g} us per step, which a faster link does not shorten "
                               f"(every ns as bandwidth would give {was * 8e3:.4g} Mbit/s)")
    notes += list(one_size.values())
    model = transfers(lf, starts, params).astype(np.float64)
    rel = (model - measured) / np.maximum(measured, 1)
    rms = {c: float(np.sqrt(np.mean(rel[(lf.link_class == c) & timed] ** 2))) for c in present}
    kinds = lf.link_class.astype(str) + "/" + (np.asarray(ops, dtype=object).astype(str) if ops is not None else "")
    factor, tail, share = _factors(lf, starts, measured, params, np.unique(kinds, return_inverse=True)[1], alone,
                                   frame_bytes)
    return Fit(params=params, rel_rms=rms, flows={c: int(((lf.link_class == c) & timed).sum()) for c in present},
               source=source, factor=factor, tail_ns=tail, latency_share=share, notes=notes, shared=shared)


def _at_nominal(lf: LinkFlows, starts: np.ndarray, measured: np.ndarray, lone: np.ndarray, prm: LinkParams, c: str,
                rate: float, bound_ns: float | None):
    """(the parameters with class c at its nominal rate, and the capacity it had) or None. Transfers of one size
    time a link equally well as a slower link with no latency or as a faster one with some (a pipeline's 64 KiB
    sends: 0.99 ms at 400 Mbit/s, 7.86 ms at 50, each about 0.2 ms over their bytes' time at the rate): at the
    rate the NICs were shaped to, the rest of the typical lone transfer (lone: class c's lone transfers beyond one
    frame; the median) is the link's latency per step, which a bandwidth what-if keeps. None where that is more
    than the link can have (bound_ns: its round trip and one frame; unknown: nothing to check it by), where there
    are too few lone transfers, or where the typical one is faster than the nominal rate allows: then the rate is
    not the link's (a NIC sold at twice the rate its transfers show), and the fit's own capacity stands."""
    if lone.sum() < MIN_LONE or bound_ns is None:
        return None
    lat_max = float(np.min(measured[lone] / np.maximum(lf.lat_steps[lone], 1.0)))

    def at(step_ns):
        return replace(prm, capacity={**prm.capacity, c: rate}, latency_ns={**prm.latency_ns, c: step_ns},
                       overhead_ns={**prm.overhead_ns, c: 0.0})

    def over(step_ns):  # how much longer the typical lone transfer took than modelled
        return float(np.median(measured[lone] - transfers(lf, starts, at(step_ns))[lone]))

    if over(0.0) <= 0:
        return None
    lo, hi = 0.0, lat_max
    while hi - lo >= 1.0:  # to the ns: over() falls as the latency grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if over(mid) > 0 else (lo, mid)
    return None if lo > bound_ns else (at(lo), prm.capacity[c])


def _lone_fit(steps: np.ndarray, size: np.ndarray, y: np.ndarray):
    """(latency ns, capacity bytes/ns, separable, transfers) from lone transfers: y = latency x steps + size /
    capacity. None when nothing is left to fit (no bytes)."""
    ok = (size > 0) & (y > 0)
    if ok.sum() < 1:
        return None
    A, Bn, y = steps[ok], size[ok], y[ok]
    sep = separable(A, Bn)
    if sep:
        keep = inliers(A, Bn, y)
        if keep.sum() >= 2 and separable(A[keep], Bn[keep]):
            A, Bn, y = A[keep], Bn[keep], y[keep]
        latency, beta = weighted_fit(A, Bn, y)
        if beta <= 0:
            return None
        return latency, 1.0 / beta, True, int(ok.sum())
    return 0.0, float(np.median(Bn / y)), False, int(ok.sum())


def _capacity_given(lf: LinkFlows, sel: np.ndarray, measured: np.ndarray, latency: float) -> float:
    """The capacity that lone transfers show once the latency is taken off (median of bytes / rest)."""
    rest = measured[sel] - latency * lf.lat_steps[sel]
    good = rest > 0
    if not good.any():
        return float(np.median(lf.bytes[sel] / np.maximum(measured[sel], 1)))
    return float(np.median(lf.bytes[sel][good] / rest[good]))


def _factors(lf: LinkFlows, starts: np.ndarray, measured: np.ndarray, prm: LinkParams, groups: np.ndarray,
             alone: np.ndarray, frame_bytes: float = 0.0):
    """Per flow: the factor on its bytes, its tail (ns >= 0) and its latency share. The factor first: the bytes each
    flow moved at the max-min rates the links give the flows in flight together, over its measured window after
    its latency (the windows are the run's: replayed with those bytes from the measured starts, every flow ends
    when it did), over its modelled bytes. Then no lone flow (alone: it had its links to itself) keeps more than the
    median factor of the lone flows of its group (groups: link class and op): what a lone transfer took beyond the
    typical one of its kind (a worker thread descheduled, a retransmission) is a delay of its own, kept as its tail,
    not bandwidth a faster link would shrink. A flow that shared a link keeps its factor: how the run split the
    link among its flows (TCP serves the first of gloo's buckets faster than max-min would) moves with the link.
    A lone flow of at most one frame (frame_bytes) keeps no factor above 1: a message that small is not paced by the
    link beyond its own serialization, so the rest of its time (gloo's 512-byte all-reduces of a tensor-parallel
    optimizer step took 25x their bytes' time, a thread waking on the next scheduler tick) is its tail.
    Fewer bytes on a flow never slow another, so every flow then ends no later than measured. A transfer shorter
    than its latency keeps the share of it that fits (latency share < 1) and moves nothing."""
    lat = lf.lat_steps * np.array([prm.step_ns(c) for c in lf.link_class], np.float64)
    share = np.where(lat > measured, measured / np.maximum(lat, 1.0), 1.0)
    share[measured <= 0] = 0.0
    begin, end = starts.astype(np.float64) + lat * share, (starts + measured).astype(np.float64)
    moved = _moved(lf, begin, end, prm) + _free_bytes(lf, begin, end, prm)
    k = np.where(lf.bytes > 0, moved / np.maximum(lf.bytes, 1e-300), 0.0)
    for gid in np.unique(groups):
        sel = (groups == gid) & (k > 0) & alone
        if sel.any():
            k[sel] = np.minimum(k[sel], np.median(k[sel]))
    one_frame = alone & (lf.bytes <= frame_bytes)
    k[one_frame] = np.minimum(k[one_frame], 1.0)
    # float rounding can leave a flow a few ns past its measured end: shortened by a hair, no tail is negative
    for _ in range(8):
        t = transfers(lf, starts, prm, k, share)
        over = t > measured
        if not over.any():
            break
        own = lat[over] * share[over]
        k[over] *= np.maximum(measured[over] - 2 - own, 0) / np.maximum(t[over] - own, 1)
    t = transfers(lf, starts, prm, k, share)
    return k, np.maximum(measured - t, 0).astype(np.int64), share


def _free_bytes(lf: LinkFlows, begin: np.ndarray, end: np.ndarray, prm: LinkParams) -> np.ndarray:
    """Bytes each flow took from token buckets when it began moving (the engine's rule, replay/sharing.py), with
    every flow moving over its own window [begin, end): a bucket refills at its link's capacity while no window
    is open on the link."""
    n = len(lf)
    out = np.zeros(n)
    fl = lf.flows(np.arange(n), prm) if n else None
    if n == 0 or not (fl.burst > 0).any():
        return out
    tokens = fl.burst.copy()
    crossing = np.zeros(len(tokens), np.int64)
    idle_since = np.full(len(tokens), -np.inf)
    # ends before begins at one time: a link freed as the next flow begins has no time to refill
    events = sorted([(e, 0, f) for f, e in enumerate(end)] + [(b, 1, f) for f, b in enumerate(begin)])
    for t, kind, f in events:
        route = lf.route_links[lf.route_ptr[f]:lf.route_ptr[f + 1]]
        if kind == 0:
            crossing[route] -= 1
            idle_since[route[crossing[route] == 0]] = t
            continue
        bucketed = route[fl.burst[route] > 0]
        if len(bucketed):
            idle = bucketed[crossing[bucketed] == 0]
            tokens[idle] = np.minimum(fl.burst[idle], tokens[idle] + fl.capacity[idle] * np.maximum(
                t - idle_since[idle], 0.0))
            out[f] = min(float(tokens[bucketed].min()), float(lf.bytes[f]))
            tokens[bucketed] -= out[f]
        crossing[route] += 1
    return out


def _moved(lf: LinkFlows, begin: np.ndarray, end: np.ndarray, prm: LinkParams) -> np.ndarray:
    """Bytes each flow moves over [begin, end) when every flow moves over its own window at the max-min fair rate
    its links give the flows moving together (piecewise constant between the windows' edges)."""
    n = len(lf)
    out = np.zeros(n)
    if n == 0:
        return out
    cap = lf.flows(np.arange(n), prm).capacity
    edges = np.unique(np.concatenate([begin, end]))
    order_b, order_e = np.argsort(begin, kind="stable"), np.argsort(end, kind="stable")
    on = np.zeros(n, bool)
    rate = np.zeros(n)
    rem, n_on, touched = np.zeros(len(cap)), np.zeros(len(cap), np.int64), np.zeros(len(cap), np.int64)
    frozen = np.zeros(n, np.bool_)
    ib = ie = 0
    for j in range(len(edges) - 1):
        t, t1 = edges[j], edges[j + 1]
        while ie < n and end[order_e[ie]] <= t:
            on[order_e[ie]] = False
            ie += 1
        while ib < n and begin[order_b[ib]] <= t:
            f = order_b[ib]
            on[f] = end[f] > t
            ib += 1
        active = np.flatnonzero(on)
        if not len(active):
            continue
        _max_min(active, len(active), lf.route_ptr, lf.route_links, cap, rate, rem, n_on, frozen, touched)
        fin = np.isfinite(rate[active])
        out[active[fin]] += rate[active[fin]] * (t1 - t)
    return out


# the busy-period fit, for classes whose transfers all shared a link (no lone one to regress on)
def busy_period_fit(lf: LinkFlows, starts_ns: np.ndarray, measured_ns: np.ndarray, *, classes, start: LinkParams,
                    rounds: int = 2, periods: "_Periods | None" = None) -> LinkParams:
    """Capacity and latency of the given link classes that make the flows, replayed from their measured starts
    and sharing the links, keep the links busy as long as the run did: each flow's busy period (its links
    in use without a break) ends when the measured one did (least squares in error relative to the time
    from the flow's start to that end). Busy periods, unlike each flow's own time, do not depend on how the
    link was shared among its flows (max-min here; a TCP connection that gloo's buckets share serves the first
    one faster): the fit takes the link's throughput, not the sharing discipline. The periods are the
    measured ones for the predicted times too: re-partitioned, a period that ended a hair before the next
    flow started would swallow it as soon as a candidate is slightly slower, its end jumping by that
    flow's whole time, and the fit would run to whatever capacity keeps the hair (on a 400 Mbit/s testbed
    run, 448 Mbit/s with 53% residual; 409 Mbit/s and 20% on the measured periods).

    Overlapping transfers that end together say how long the link was busy, not how that time splits into
    latency and bandwidth: a period's end fits a latency of nothing as well as one near the whole transfer (on a
    4-rank run the best fit was 790 Mbit/s and 54 ms a ring step, for a 100 Mbit/s link). So the fit takes the
    least latency whose best capacity fits the periods within 10% of the best fit's loss, or within 5% rms:
    what the periods need, no more. Classes are fitted in turn, the others held at their current value
    (`start` for the ones not fitted here). periods: the flows' measured busy periods, where the caller has them."""
    meas = np.maximum(measured_ns.astype(np.float64), 1.0)
    # a transfer measured as nothing had no shared window (a rank finished before the last arrived: see the
    # graph's notes); it says nothing of the link, and in relative error it would outweigh every other one
    timed = measured_ns > 0
    cap, lat = dict(start.capacity), dict(start.latency_ns)
    for c in classes:  # start: each class's flows as if alone (bytes / time), no latency
        sel = (lf.link_class == c) & timed
        cap[c] = float(np.median(lf.bytes[sel] / meas[sel])) or 1.0
        lat[c] = 0.0

    periods = periods or _Periods(lf, starts_ns, measured_ns)

    def loss(c, cp, lt):
        return periods.loss(c, LinkParams({**cap, c: cp}, {**lat, c: lt}, burst=dict(start.burst)))

    def best_capacity(c, lt, around):
        return _best_capacity(lambda cp: loss(c, cp, lt), around)

    for _ in range(rounds):
        for c in classes:
            sel = (lf.link_class == c) & timed
            lat_max = float(np.min(meas[sel] / np.maximum(lf.lat_steps[sel], 1.0)))
            fits = [(lt,) + best_capacity(c, lt, cap[c]) for lt in lat_max * _LATENCY_SHARES]
            floor = min(f[1] for f in fits)
            lt, _, cp = next(f for f in fits if f[1] <= max(floor * 1.10, _GOOD_LOSS))
            cap[c], lat[c] = cp, lt
    return LinkParams(cap, lat, burst=dict(start.burst))


class _Periods:
    """The measured busy periods of the flows' links, and how far a parameter set's periods end from them."""

    def __init__(self, lf: LinkFlows, starts_ns: np.ndarray, measured_ns: np.ndarray):
        self.lf, self.starts = lf, starts_ns.astype(np.int64)
        self.timed = measured_ns > 0
        end = self.starts + measured_ns.astype(np.int64)
        self.periods = busy_periods(lf, self.starts, end)
        self.ends = period_ends(lf, self.starts, end, self.periods)
        self.horizon = np.maximum(self.ends - self.starts, 1).astype(np.float64)

    def loss(self, c: str, prm: LinkParams) -> float:
        """Mean squared relative error of class c's flows' period ends when the flows share the links under prm."""
        lf, starts = self.lf, self.starts
        pred = period_ends(lf, starts, starts + transfers(lf, starts, prm), self.periods)
        sel = (lf.link_class == c) & self.timed
        return float(np.mean(((pred[sel] - self.ends[sel]) / self.horizon[sel]) ** 2))


def _best_capacity(loss_of, around: float):
    """(loss, capacity) of the capacity that minimizes loss_of(capacity): coarse-to-fine over log capacity."""
    lo, hi = np.log(around) - 3.0, np.log(around) + 3.0
    best = (np.inf, around)
    for _zoom in range(4):
        for lc in np.linspace(lo, hi, 13):
            v = loss_of(float(np.exp(lc)))
            if v < best[0]:
                best = (v, float(np.exp(lc)))
        span = (hi - lo) / 6.0
        lo, hi = np.log(best[1]) - span, np.log(best[1]) + span
    return best


def burst_fit(periods: _Periods, prm: LinkParams, c: str):
    """A token bucket for link class c (replay/sharing.py), where the run shows one: the depth, with the capacity
    refitted under it (the latency kept), whose busy periods end closest to the measured ones. A shaper with a
    deep bucket lets a transfer after an idle spell past its rate: without the bucket the fit takes the link as
    faster than its rate and every transfer's own factor makes up the rest, which a what-if that changes the idle
    spells gets wrong. Taken only where the run shows it (BURST_GAIN, BURST_MIN_RATE); returns (depth bytes,
    capacity, loss without, loss with) or None. periods: the flows' measured busy periods (_Periods)."""

    def with_burst(b):
        return lambda cp: periods.loss(c, replace(prm, capacity={**prm.capacity, c: cp},
                                                  burst={**prm.burst, c: b} if b else dict(prm.burst)))

    none = _best_capacity(with_burst(0.0), prm.capacity[c])
    if none[0] <= _GOOD_LOSS:  # the periods end where they did without one
        return None
    tried = [(*_best_capacity(with_burst(b), none[1]), b) for b in BURSTS]
    i = min(range(len(tried)), key=lambda j: tried[j][0])
    loss, capacity, depth = tried[i]
    # a bucket the run shows: clearly better than none, at the next smaller depth too (transfers of one size can
    # be fitted by one depth and a rate far below theirs, a trade of tokens for rate the run does not show), and
    # a rate not far below the one the transfers show without it
    if (loss < BURST_GAIN * none[0] and i > 0 and tried[i - 1][0] < none[0]
            and capacity >= BURST_MIN_RATE * none[1]):
        return depth, capacity, none[0], loss
    return None


# token bucket depths the burst fit tries (bytes): 16 KB to 4 MB
BURSTS = np.geomspace(16e3, 4e6, 13)
# a bucket is taken where its periods' loss is under this share of the loss without one
BURST_GAIN = 0.5
# and where the rate under it is at least this share of the rate the transfers show without one (the shaped buckets
# of the link sweep took 0.85-0.95 of it; a pipeline's one-size sends had traded 40 KB of tokens for 0.37 of it)
BURST_MIN_RATE = 0.8

# a busy-period fit whose periods end within 5% rms of the measured ones is as good as the timing lets it be: the
# least latency that reaches it (or 10% of the best fit's loss) is taken
_GOOD_LOSS = 0.05 ** 2
# latencies tried by the busy-period fit, as shares of the most a ring step can take (the shortest transfer / steps)
_LATENCY_SHARES = np.array([0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0])


def from_alpha_beta(model) -> Fit:
    """Link parameters from an alpha-beta calibration whose transfers never overlapped (nccl-tests runs one
    collective at a time): each link class's bandwidth and latency as fitted."""
    cap = {c: model.links[c].bandwidth_gbps for c in (INTRA, INTER)}  # 1 GB/s = 1 byte/ns
    lat = {c: model.links[c].alpha_ns for c in (INTRA, INTER)}
    fitted = [c for c in (INTRA, INTER) if model.link_sources.get(c) == "fit"]
    rms = {c: float(np.average([f.rel_rms for f in model.classes.values() if f.link_class == c])) for c in fitted}
    return Fit(params=LinkParams(cap, lat), rel_rms=rms,
               flows={c: sum(f.n_rows for f in model.classes.values() if f.link_class == c) for c in fitted},
               source={c: "nccl-tests" for c in fitted})


def tail_at(tail_ns: int, fill_run_ns: float, fill_ns: float) -> int:
    """A lone transfer's tail (ns) on links whose token bucket fills in fill_ns (its depth over its rate) where the
    run's filled in fill_run_ns. Part of a tail is its sender stalled mid-transfer (a worker thread descheduled on a
    busy machine): while it is, the bucket fills, and once the sender resumes the bucket lets what it holds go at
    once, so a stall costs the transfer only what it lasts beyond the bucket's fill. A slower link or a deeper
    bucket fills in longer and hides more of each stall: the tail shrinks by the difference. On a faster link the
    stalls that the run's bucket hid stay unseen: the tail is kept as measured. On the testbed (a 2-frame bucket:
    2.9 ms at 50 Mbit/s, 0.5 ms at 400) TP's 256 KiB all-reduces and a pipeline's 64 KiB sends had tails of a mean
    0.62 and 0.82 ms at 400 Mbit/s, 0.14 and 0.11 ms at 50; from 400 this gives TP's 0.12, 0.35 and 0.53 ms at 50,
    100 and 200 Mbit/s (measured 0.14, 0.31 and 0.53)."""
    return max(0, int(round(tail_ns - max(0.0, fill_ns - fill_run_ns))))


def carry(measured: LinkFlows, fitted: Fit, lf: LinkFlows, resized: np.ndarray):
    """Per flow of the scenario's LinkFlows: the factor, tail and latency share its collective's measured flow was
    fitted with, when the collective crosses the same class of link as in the run; a collective the scenario
    resized (resized: per collective row; a data-parallel change) has no measured residual of its own: the model
    alone (factor 1, no tail); one a [topology] moved onto another class takes the median factor of the run's flows
    of that class (1 where the run has none) and no tail. A collective moved onto optical circuits keeps what it had
    on the NICs they replace: the same transfer over another port of the host."""
    n = len(lf)
    if fitted.factor is None:
        return None, np.zeros(n, np.int64), None
    by_row = {int(r): i for i, r in enumerate(measured.coll_row)}
    cls_median = {}
    for c in (INTER, INTRA):
        k = fitted.factor[(measured.link_class == c) & (fitted.factor > 0)]
        cls_median[c] = float(np.median(k)) if len(k) else 1.0
    factor, share = np.empty(n), np.ones(n)
    tail = np.zeros(n, np.int64)
    for i, (row, c) in enumerate(zip(lf.coll_row, lf.link_class)):
        c = INTER if c == OPTICAL else c
        j = by_row.get(int(row))
        if resized[row]:
            factor[i] = 1.0
        elif j is not None and measured.link_class[j] == c:
            factor[i], tail[i], share[i] = fitted.factor[j], fitted.tail_ns[j], fitted.latency_share[j]
        else:
            factor[i] = cls_median[c]
    return factor, tail, share
