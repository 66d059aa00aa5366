"""The shared-link network model: collectives as flows over the links of the run's hosts.

Links: each host's NIC, one link each way (`tx`, `rx`, class inter_node), and each rank's own port into
the host's fabric (`tx`, `rx`, class intra_node: NVLink on a GPU node, loopback on a CPU one). A
collective instance is one flow (replay/sharing.py) over the links its ring crosses: every rank's port
when its group stays on one host, every host's NIC when it spans hosts (with the ranks' ports as well
when a host holds several of them); a send and its recv cross the sender's link out and the receiver's in. On
each of those links it moves the bytes of the alpha-beta table
(ring all-reduce: 2(p-1)/p n; reduce-scatter, all-gather, all-to-all: (p-1)/p n; broadcast, reduce,
send/recv: n), after a latency of the table's latency term (2(p-1) alpha for a ring all-reduce). Flows
that are in flight together share each link max-min fairly: two all-reduces on a host's NIC get half
of it each, and a ring runs at the pace of its slowest link.

An optical circuit switch ([optical], replay/optical.py) gives each host circuit ports of its own (`circuit`,
class optical): a collective the circuit assignment puts on circuits crosses the hosts' circuit ports instead
of their NICs, with the same sharing; a circuit's capacity and latency are the `optical` class's (the
inter_node class's where a parameter set has none).

A collective whose bytes are unknown, whose op the table does not model or whose group is one rank
keeps its measured transfer and occupies no link; `LinkFlows.notes` says how many.

Capacities are bytes per ns (1 GB/s = 1 byte/ns), latencies ns. replay/linkfit.py calibrates capacity and
latency per link class, and a factor per transfer, on the run's own transfers replayed as flows from their
measured starts, so that transfers that overlapped share the link in the fit as they did in the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses.intervals import shift_apart

from .costs import P2P_OPS, flat_coefficients
from .sharing import Flows

INTRA, INTER, OPTICAL = "intra_node", "inter_node", "optical"
HOST_PORTS = (INTER, OPTICAL)  # links a host owns (its NIC, its circuit ports): per-host factors apply
# a busy period does not end at a gap shorter than this: a measured end is when a woken caller saw its
# collective done, which lags the link going idle by a thread's wake-up; the next flow starting 30 us after
# it (a 400 Mbit/s testbed run) kept the link busy. The validation matrix is the same for 0.1 to 1 ms; from
# 5 ms on, periods the 4-host run really had idle between merge (its data-parallel prediction moves)
GAP_NS = 200_000


@dataclass(frozen=True)
class LinkParams:
    """Capacity (bytes/ns) and latency (ns per latency step) of each link class, per-host NIC factors, the depth
    (bytes) of each class's token bucket (replay/sharing.py; a class without one has none), and the software time
    per latency step beyond the link's latency (ns; a worker thread's wake-up, the protocol: what a fitted latency
    has above the link's round trip, replay/linkfit.py), which a faster or nearer link does not shorten."""
    capacity: dict[str, float]
    latency_ns: dict[str, float]
    host_scale: dict[int, float] = field(default_factory=dict)  # host index -> NIC capacity factor
    burst: dict[str, float] = field(default_factory=dict)
    overhead_ns: dict[str, float] = field(default_factory=dict)

    def step_ns(self, c: str) -> float:
        """ns a latency step of link class c takes: the link's latency and the software's."""
        return _of(self.latency_ns, c) + _of(self.overhead_ns, c, 0.0)

    def scaled(self, bandwidth: float = 1.0, latency: float = 1.0, host_scale: dict[int, float] | None = None,
               capacity: dict[str, float] | None = None, latency_ns: dict[str, float] | None = None,
               class_scale: dict[str, float] | None = None) -> "LinkParams":
        cap = {c: v * bandwidth * (class_scale or {}).get(c, 1.0) for c, v in self.capacity.items()}
        lat = {c: v * latency for c, v in self.latency_ns.items()}
        cap.update(capacity or {})
        lat.update(latency_ns or {})
        hs = dict(self.host_scale)
        for h, k in (host_scale or {}).items():
            hs[h] = hs.get(h, 1.0) * k
        # a faster link keeps its bucket's depth, and the software its time
        return LinkParams(cap, lat, hs, dict(self.burst), dict(self.overhead_ns))


@dataclass
class LinkFlows:
    """The flows of a run's collectives: routes and bytes are the topology's, capacities the parameters'."""
    coll_row: np.ndarray        # row of the collectives frame each flow belongs to
    link_class: np.ndarray      # object: INTRA / INTER / OPTICAL per flow (the class whose latency it pays)
    bytes: np.ndarray           # per link of its route
    lat_steps: np.ndarray       # latency steps (the table's alpha coefficient)
    route_ptr: np.ndarray
    route_links: np.ndarray
    link_kind: np.ndarray       # object: INTRA / INTER / OPTICAL per link
    link_host: np.ndarray       # host index per link (-1: none)
    link_names: list
    notes: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.coll_row)

    def flows(self, nodes: np.ndarray, prm: LinkParams, factor: np.ndarray | None = None,
              latency_share: np.ndarray | None = None) -> Flows:
        """The engine's Flows: flow i is graph node nodes[i], timed under prm; factor (per flow): its bytes times
        that, latency_share: its latency times that (the calibration's per-transfer factor and the share of the
        latency a transfer shorter than it had, replay/linkfit.py)."""
        cap = np.array([_of(prm.capacity, k) * (prm.host_scale.get(int(h), 1.0) if k in HOST_PORTS else 1.0)
                        for k, h in zip(self.link_kind, self.link_host)], np.float64)
        lat = self.lat_steps * np.array([prm.step_ns(c) for c in self.link_class], np.float64)
        size = self.bytes
        if factor is not None:
            size = size * factor
        if latency_share is not None:
            lat = lat * latency_share
        burst = np.array([_of(prm.burst, k, 0.0) for k in self.link_kind], np.float64)
        return Flows(node=nodes, bytes=size, latency_ns=np.rint(lat).astype(np.int64), route_ptr=self.route_ptr,
                     route_links=self.route_links, capacity=cap if len(cap) else np.ones(0),
                     burst=burst if len(cap) else np.zeros(0))


def _of(per_class: dict, c: str, default: float | None = None) -> float:
    """A class's parameter; circuits without their own take the inter_node class's; a class with neither, the
    default (None: it must have one)."""
    if c in per_class:
        return per_class[c]
    if c == OPTICAL and INTER in per_class:
        return per_class[INTER]
    if default is None:
        raise KeyError(c)
    return default


def build(colls: pd.DataFrame, host_of: dict[int, int], on_circuit: np.ndarray | None = None) -> LinkFlows:
    """The flows of the collectives frame's rows under the rank -> host map; on_circuit (per row): the rows an
    optical circuit switch carries where they cross hosts (their hosts' circuit ports, not their NICs)."""
    link_id: dict[tuple, int] = {}
    kinds, hosts, names = [], [], []

    def link(kind: str, owner: int, way: str) -> int:
        k = (kind, owner, way)
        if k not in link_id:
            link_id[k] = len(kinds)
            kinds.append(kind)
            hosts.append(owner if kind in HOST_PORTS else host_of.get(owner, -1))
            names.append({INTER: f"host{owner}.nic.{way}", OPTICAL: f"host{owner}.circuit.{way}"}.get(
                kind, f"rank{owner}.port.{way}"))
        return link_id[k]

    ops = np.array([str(o).lower() if o is not None else "" for o in colls["op"]], dtype=object)
    p = colls["group_size"].to_numpy(np.float64)
    a, f = flat_coefficients(ops, p, "ring")
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
        out = OPTICAL if on_circuit is not None and on_circuit[i] else INTER  # how it leaves a host
        if ops[i] in P2P_OPS and len(ranks) == 2:
            # a message one way: out of the sender's link, into the receiver's (ranks: [sender, receiver])
            src, dst = ranks
            r_links = ([link(out, on[src], "tx"), link(out, on[dst], "rx")] if on[src] != on[dst]
                       else [link(INTRA, src, "tx"), link(INTRA, dst, "rx")])
        else:
            if len(hs) > 1:
                for h in hs:
                    r_links += [link(out, h, "tx"), link(out, h, "rx")]
            if len(hs) == 1 or len(hs) < len(ranks):
                for r in ranks:
                    r_links += [link(INTRA, r, "tx"), link(INTRA, r, "rx")]
        rows.append(i)
        cls.append(out if len(hs) > 1 else INTRA)
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
    s, e, _ = shift_apart(lk, s, e)  # one running maximum over all links at once
    same = lk[1:] == lk[:-1]
    before = np.maximum.accumulate(e)  # the latest end of the flows started so far (on this link: shifted)
    earlier = np.r_[False, same & (s[1:] < before[:-1])]  # started before an earlier one on its link ended
    later = np.r_[same & (s[1:] < e[:-1]), False]  # the next one on its link started before it ended
    out[who[earlier | later]] = True
    return out


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
