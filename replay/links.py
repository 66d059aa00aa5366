"""The shared-link network model: collectives as flows over the links of the run's hosts.

Links: each host's NIC, one link each way (`tx`, `rx`, class inter_node), and each rank's own port into
the host's fabric (`tx`, `rx`, class intra_node: NVLink on a GPU node, loopback on a CPU one). A
collective instance is one flow (replay/sharing.py) over the links its ring crosses: every rank's port
when its group stays on one host, every host's NIC when it spans hosts (with the ranks' ports as well
when a host holds several of them). On each of those links it moves the bytes of the alpha-beta table
(ring all-reduce: 2(p-1)/p n; reduce-scatter, all-gather, all-to-all: (p-1)/p n; broadcast, reduce,
send/recv: n), after a latency of the table's latency term (2(p-1) alpha for a ring all-reduce). Flows
that are in flight together share each link max-min fairly: two all-reduces on a host's NIC get half
of it each, and a ring runs at the pace of its slowest link.

A collective whose bytes are unknown, whose op the table does not model or whose group is one rank
keeps its measured transfer and occupies no link; `LinkFlows.notes` says how many.

Capacities are bytes per ns (1 GB/s = 1 byte/ns), latencies ns. `fit()` calibrates capacity and latency
per link class from the run's own transfers replayed as flows with their measured starts, so that
transfers that overlapped share the link in the fit as they did in the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .engine import Engine
from .network import _flat_coefficients
from .sharing import Flows

INTRA, INTER = "intra_node", "inter_node"
# a busy period does not end at a gap shorter than this: a measured end is when a woken caller saw its
# collective done, which lags the link going idle by a thread's wake-up; the next flow starting 30 us after
# it (a 400 Mbit/s testbed run) kept the link busy. The validation matrix is the same for 0.1 to 1 ms; from
# 5 ms on, periods the 4-host run really had idle between merge (its data-parallel prediction moves)
GAP_NS = 200_000


@dataclass(frozen=True)
class LinkParams:
    """Capacity (bytes/ns) and latency (ns per latency step) of each link class, and per-host NIC factors."""
    capacity: dict[str, float]
    latency_ns: dict[str, float]
    host_scale: dict[int, float] = field(default_factory=dict)  # host index -> NIC capacity factor

    def scaled(self, bandwidth: float = 1.0, latency: float = 1.0, host_scale: dict[int, float] | None = None,
               capacity: dict[str, float] | None = None, latency_ns: dict[str, float] | None = None) -> "LinkParams":
        cap = {c: v * bandwidth for c, v in self.capacity.items()}
        lat = {c: v * latency for c, v in self.latency_ns.items()}
        cap.update(capacity or {})
        lat.update(latency_ns or {})
        hs = dict(self.host_scale)
        for h, k in (host_scale or {}).items():
            hs[h] = hs.get(h, 1.0) * k
        return LinkParams(cap, lat, hs)


@dataclass
class LinkFlows:
    """The flows of a run's collectives: routes and bytes are the topology's, capacities the parameters'."""
    coll_row: np.ndarray        # row of the collectives frame each flow belongs to
    link_class: np.ndarray      # object: INTRA / INTER per flow (the class whose latency it pays)
    bytes: np.ndarray           # per link of its route
    lat_steps: np.ndarray       # latency steps (the table's alpha coefficient)
    route_ptr: np.ndarray
    route_links: np.ndarray
    link_kind: np.ndarray       # object: INTRA / INTER per link
    link_host: np.ndarray       # host index per link (-1: none)
    link_names: list
    notes: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.coll_row)

    def flows(self, nodes: np.ndarray, prm: LinkParams) -> Flows:
        """The engine's Flows: flow i is graph node nodes[i], timed under prm."""
        cap = np.array([prm.capacity[k] * (prm.host_scale.get(int(h), 1.0) if k == INTER else 1.0)
                        for k, h in zip(self.link_kind, self.link_host)], np.float64)
        lat = np.rint(self.lat_steps * np.array([prm.latency_ns[c] for c in self.link_class], np.float64))
        return Flows(node=nodes, bytes=self.bytes, latency_ns=lat.astype(np.int64), route_ptr=self.route_ptr,
                     route_links=self.route_links, capacity=cap if len(cap) else np.ones(0))


def build(colls: pd.DataFrame, host_of: dict[int, int]) -> LinkFlows:
    """The flows of the collectives frame's rows under the rank -> host map."""
    link_id: dict[tuple, int] = {}
    kinds, hosts, names = [], [], []

    def link(kind: str, owner: int, way: str) -> int:
        k = (kind, owner, way)
        if k not in link_id:
            link_id[k] = len(kinds)
            kinds.append(kind)
            hosts.append(owner if kind == INTER else host_of.get(owner, -1))
            names.append(f"host{owner}.nic.{way}" if kind == INTER else f"rank{owner}.port.{way}")
        return link_id[k]

    ops = np.array([str(o).lower() if o is not None else "" for o in colls["op"]], dtype=object)
    p = colls["group_size"].to_numpy(np.float64)
    a, f = _flat_coefficients(ops, p, "ring")
    nbytes = pd.to_numeric(colls["bytes"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    rows, cls, size, steps, ptr, route = [], [], [], [], [0], []
    unknown = unmodelled = 0
    for i, ranks in enumerate(colls["ranks"]):
        ranks = [int(r) for r in ranks]
        if len(ranks) < 2:
            continue
        if np.isnan(a[i]):
            unmodelled += 1
            continue
        if np.isnan(nbytes[i]):
            unknown += 1
            continue
        on = {r: host_of.get(r, -1 - r) for r in ranks}  # a rank of unknown host is a host of its own
        hs = sorted(set(on.values()))
        r_links = []
        if len(hs) > 1:
            for h in hs:
                r_links += [link(INTER, h, "tx"), link(INTER, h, "rx")]
        if len(hs) == 1 or len(hs) < len(ranks):
            for r in ranks:
                r_links += [link(INTRA, r, "tx"), link(INTRA, r, "rx")]
        rows.append(i)
        cls.append(INTER if len(hs) > 1 else INTRA)
        size.append(f[i] * nbytes[i])
        steps.append(a[i])
        route += r_links
        ptr.append(len(route))
    notes = []
    if unknown:
        notes.append(f"{unknown} collective(s) without a byte count keep their measured transfer and occupy no link")
    if unmodelled:
        notes.append(f"{unmodelled} collective(s) of an op the link model does not cost keep their measured transfer")
    return LinkFlows(coll_row=np.asarray(rows, np.int64), link_class=np.asarray(cls, dtype=object),
                     bytes=np.asarray(size, np.float64), lat_steps=np.asarray(steps, np.float64),
                     route_ptr=np.asarray(ptr, np.int64), route_links=np.asarray(route, np.int64),
                     link_kind=np.asarray(kinds, dtype=object), link_host=np.asarray(hosts, np.int64),
                     link_names=names, notes=notes)


def transfers(lf: LinkFlows, starts_ns: np.ndarray, prm: LinkParams) -> np.ndarray:
    """Each flow's time (ns) when the flows start at starts_ns (their measured barrier starts) and share
    the links under prm, with nothing else in the replay: the calibration's forward model."""
    n = len(lf)
    if n == 0:
        return np.zeros(0, np.int64)
    t0 = int(starts_ns.min())
    e = Engine(n + 1, np.zeros(n, np.int64), np.arange(1, n + 1), np.zeros(n, bool), starts_ns - t0, source=0,
               t0_ns=t0)
    s = e.run(np.zeros(n + 1, np.int64), flows=lf.flows(np.arange(1, n + 1), prm))
    return s.end_ns[1:] - s.start_ns[1:]


def _by_link(lf: LinkFlows, start_ns: np.ndarray, end_ns: np.ndarray):
    """The (flow, link) entries of the routes sorted by link, then start: the order (into lf.route_links), and
    per sorted entry its flow, start, end and link."""
    owner = np.repeat(np.arange(len(lf)), np.diff(lf.route_ptr))
    order = np.lexsort((start_ns[owner], lf.route_links))
    who = owner[order]
    return order, who, start_ns[who], end_ns[who], lf.route_links[order]


def busy_periods(lf: LinkFlows, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """The busy period of each (flow, link) entry of the routes (lf.route_links' order): a link's flows'
    intervals merged where they overlap or are less than GAP_NS apart, numbered over all links."""
    if not len(lf):
        return np.zeros(0, np.int64)
    order, _who, s, e, lk = _by_link(lf, start_ns, end_ns)
    new_link = np.r_[True, lk[1:] != lk[:-1]]
    period = np.empty(len(order), np.int64)
    k = -1
    cur = 0
    for i in range(len(order)):  # a new period where a link starts or a flow starts after its link went idle
        if new_link[i] or s[i] > cur + GAP_NS:
            k += 1
            cur = e[i]
        else:
            cur = max(cur, e[i])
        period[i] = k
    out = np.empty(len(order), np.int64)
    out[order] = period
    return out


def overlapped(lf: LinkFlows, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Per flow: whether its measured window overlapped another flow's on a link they both cross (the
    transfers shared the link in the run)."""
    out = np.zeros(len(lf), bool)
    if len(lf) < 2:
        return out
    _order, who, s, e, lk = _by_link(lf, start_ns, end_ns)
    # one running maximum over all links at once: each link's times shifted past the previous link's
    t0 = int(s.min())
    span = int(max(e.max(), s.max())) - t0 + 1
    if int(lk.max()) + 1 <= (2 ** 62) // span:
        shift = lk.astype(np.int64) * span - t0
        s, e = s + shift, e + shift
    else:  # windows too far apart for int64 (a trace with a clock jump): link k's rank among the links instead
        s, e = _rank_within_links(s, e, lk)
    same = lk[1:] == lk[:-1]
    before = np.maximum.accumulate(e)  # the latest end of the flows started so far (on this link: shifted)
    earlier = np.r_[False, same & (s[1:] < before[:-1])]  # started before an earlier one on its link ended
    later = np.r_[same & (s[1:] < e[:-1]), False]  # the next one on its link started before it ended
    out[who[earlier | later]] = True
    return out


def _rank_within_links(s: np.ndarray, e: np.ndarray, lk: np.ndarray):
    """Starts and ends replaced by their order among all times, offset per link (for overlapped)."""
    both = np.unique(np.r_[s, e])
    n = len(both) + 1
    shift = lk.astype(np.int64) * n
    return np.searchsorted(both, s) + shift, np.searchsorted(both, e) + shift


def period_ends(lf: LinkFlows, start_ns: np.ndarray, end_ns: np.ndarray, periods: np.ndarray | None = None) -> np.ndarray:
    """Per flow: when the busy period it is in ends, the latest over the links it crosses. periods: the
    entries' busy periods to use (busy_periods of other times: the measured ones), else those of these times."""
    out = end_ns.astype(np.int64).copy()
    if not len(lf):
        return out
    periods = busy_periods(lf, start_ns, end_ns) if periods is None else periods
    owner = np.repeat(np.arange(len(lf)), np.diff(lf.route_ptr))
    pend = np.full(int(periods.max()) + 1, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(pend, periods, end_ns[owner].astype(np.int64))
    np.maximum.at(out, owner, pend[periods])
    return out


@dataclass(frozen=True)
class Fit:
    params: LinkParams
    rel_rms: dict[str, float]   # per link class: root-mean-square relative residual of the flows' times
    flows: dict[str, int]       # per link class: flows fitted


def fit(lf: LinkFlows, starts_ns: np.ndarray, measured_ns: np.ndarray, *, rounds: int = 2) -> Fit:
    """Capacity and latency per link class that make the flows, replayed from their measured starts and
    sharing the links, keep the links busy as long as the run did: each flow's busy period (its links
    in use without a break) ends when the measured one did (least squares in error relative to the time
    from the flow's start to that end; coarse-to-fine search over log capacity and the latency's share of
    the fastest transfer). Busy periods, unlike each flow's own time, do not depend on how the link was
    shared among its flows (max-min here; a TCP connection that gloo's buckets share serves the first
    one faster): the fit takes the link's throughput, not the sharing discipline. The periods are the
    measured ones for the predicted times too: re-partitioned, a period that ended a hair before the next
    flow started would swallow it as soon as a candidate is slightly slower, its end jumping by that
    flow's whole time, and the fit would run to whatever capacity keeps the hair (on a 400 Mbit/s testbed
    run, 448 Mbit/s with 53% residual; 409 Mbit/s and 20% on the measured periods). Classes are fitted in
    turn, the other held at its current value."""
    meas = np.maximum(measured_ns.astype(np.float64), 1.0)
    # a transfer measured as nothing had no shared window (a rank finished before the last arrived: see the
    # graph's notes); it says nothing of the link, and in relative error it would outweigh every other one
    timed = measured_ns > 0
    present = [c for c in (INTER, INTRA) if ((lf.link_class == c) & timed).any()]
    cap = {INTRA: 1.0, INTER: 1.0}
    lat = {INTRA: 0.0, INTER: 0.0}
    for c in present:  # start: each class's flows as if alone (bytes / time), no latency
        sel = (lf.link_class == c) & timed
        cap[c] = float(np.median(lf.bytes[sel] / meas[sel])) or 1.0

    starts = starts_ns.astype(np.int64)
    meas_periods = busy_periods(lf, starts, starts + measured_ns.astype(np.int64))
    meas_pe = period_ends(lf, starts, starts + measured_ns.astype(np.int64), meas_periods)
    horizon = np.maximum(meas_pe - starts, 1).astype(np.float64)

    def loss(c, cp, lt):
        prm = LinkParams({**cap, c: cp}, {**lat, c: lt})
        pred_pe = period_ends(lf, starts, starts + transfers(lf, starts_ns, prm), meas_periods)
        sel = (lf.link_class == c) & timed
        return float(np.mean(((pred_pe[sel] - meas_pe[sel]) / horizon[sel]) ** 2))

    for _ in range(rounds):
        for c in present:
            sel = (lf.link_class == c) & timed
            steps = lf.lat_steps[sel]
            lat_max = float(np.min(meas[sel] / np.maximum(steps, 1.0)))
            log_lo, log_hi = np.log(cap[c]) - 3.0, np.log(cap[c]) + 3.0
            lat_lo, lat_hi = 0.0, lat_max
            best = (loss(c, cap[c], lat[c]), cap[c], lat[c])
            for _zoom in range(4):
                for lc in np.linspace(log_lo, log_hi, 13):
                    for lt in np.linspace(lat_lo, lat_hi, 9):
                        v = loss(c, float(np.exp(lc)), float(lt))
                        if v < best[0]:
                            best = (v, float(np.exp(lc)), float(lt))
                span_c = (log_hi - log_lo) / 6.0
                span_l = (lat_hi - lat_lo) / 4.0
                log_lo, log_hi = np.log(best[1]) - span_c, np.log(best[1]) + span_c
                lat_lo, lat_hi = max(0.0, best[2] - span_l), min(lat_max, best[2] + span_l)
            cap[c], lat[c] = best[1], best[2]
    prm = LinkParams(dict(cap), dict(lat))
    rel = (period_ends(lf, starts, starts + transfers(lf, starts_ns, prm), meas_periods) - meas_pe) / horizon
    used = {c: (lf.link_class == c) & timed for c in present}
    return Fit(params=prm, rel_rms={c: float(np.sqrt(np.mean(rel[u] ** 2))) for c, u in used.items()},
               flows={c: int(u.sum()) for c, u in used.items()})


def from_alpha_beta(model) -> Fit:
    """Link parameters from an alpha-beta calibration whose transfers never overlapped (nccl-tests runs one
    collective at a time): each link class's bandwidth and latency as fitted."""
    cap = {c: model.links[c].bandwidth_gbps for c in (INTRA, INTER)}  # 1 GB/s = 1 byte/ns
    lat = {c: model.links[c].alpha_ns for c in (INTRA, INTER)}
    fitted = [c for c in (INTRA, INTER) if model.link_sources.get(c) == "fit"]
    rms = {c: float(np.average([f.rel_rms for f in model.classes.values() if f.link_class == c])) for c in fitted}
    return Fit(params=LinkParams(cap, lat), rel_rms=rms,
               flows={c: sum(f.n_rows for f in model.classes.values() if f.link_class == c) for c in fitted})
