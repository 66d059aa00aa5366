"""Flows over shared links: what the engine needs to let concurrent transfers share capacity.

A flow is a transfer the engine times while it runs instead of from a duration fixed before the replay:
it belongs to one graph node, waits its latency once the node starts, then moves `bytes` over every link
of its route at one rate (a collective's ring progresses at the pace of its slowest link, so a
collective is one flow across all the links it crosses). Concurrent flows share each link's capacity
max-min fairly, by progressive filling (the fluid model SimGrid validated): raise every flow's rate
together; when a link saturates, the flows crossing it keep their share and the others go on. The rates
are recomputed whenever a flow starts moving or ends, so a transfer's end is an event found during the
replay.

A link may have a token bucket (`burst`, bytes): as a shaper (tc tbf, a cloud NIC's burst credits) lets a
sender past its rate while it holds tokens, a flow that starts moving takes the tokens every bucketed link of its
route holds (the least of them) as bytes that pass at once, and those links' buckets give them up. A bucket
refills at its link's capacity while no flow crosses the link, up to its depth, and starts full.

Units: bytes, ns, and capacities in bytes per ns (1 GB/s = 1 byte/ns). Which links a transfer crosses and
how many bytes it moves over each is the link model's business (replay/links.py); this module only
shares. The engine's flow handling lives here too (`FlowArrays`, `FlowState` and the functions that start,
advance, end and re-rate the moving flows): plain Python over numpy arrays and named tuples that numba
compiles inside the engine's loop.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

_EPS_NS = 1e-6  # a predicted flow end this close above an integer ns is that ns (float noise, not time)


@dataclass(frozen=True)
class Flows:
    """The flows of one replay, and the links they share.

    node: the graph node each flow belongs to (its start starts the flow; its end is the flow's end);
    bytes: what the flow moves over each link of its route; latency_ns: time before it moves;
    route_ptr / route_links: CSR of each flow's links (flow f crosses route_links[route_ptr[f]:route_ptr[f+1]]);
    capacity: bytes per ns of each link; burst: the depth (bytes) of each link's token bucket (0: none; None: no
    link has one). A flow without links moves at once (its time is its latency).
    """

    node: np.ndarray
    bytes: np.ndarray
    latency_ns: np.ndarray
    route_ptr: np.ndarray
    route_links: np.ndarray
    capacity: np.ndarray
    burst: np.ndarray | None = None

    def __post_init__(self):
        node = np.ascontiguousarray(np.asarray(self.node, np.int64))
        size = np.ascontiguousarray(np.asarray(self.bytes, np.float64))
        lat = np.ascontiguousarray(np.asarray(self.latency_ns, np.int64))
        ptr = np.ascontiguousarray(np.asarray(self.route_ptr, np.int64))
        links = np.ascontiguousarray(np.asarray(self.route_links, np.int64))
        cap = np.ascontiguousarray(np.asarray(self.capacity, np.float64))
        n = len(node)
        if not (len(size) == len(lat) == n and len(ptr) == n + 1):
            raise ValueError(f"{n} flows need {n} bytes, {n} latencies and {n + 1} route pointers")
        if n and (ptr[0] != 0 or ptr[-1] != len(links) or (np.diff(ptr) < 0).any()):
            raise ValueError("route_ptr must rise from 0 to len(route_links)")
        if len(links) and (links.min() < 0 or links.max() >= len(cap)):
            raise ValueError(f"a route names a link outside 0..{len(cap) - 1}")
        if not np.isfinite(size).all() or (size < 0).any() or (lat < 0).any():
            raise ValueError("flow bytes and latencies must be finite and >= 0")
        if not np.isfinite(cap).all() or (cap <= 0).any():
            raise ValueError("link capacities must be finite and > 0")
        if len(np.unique(node)) != n:
            raise ValueError("a node carries at most one flow")
        burst = np.zeros(len(cap)) if self.burst is None else np.ascontiguousarray(np.asarray(self.burst, np.float64))
        if len(burst) != len(cap) or not np.isfinite(burst).all() or (burst < 0).any():
            raise ValueError("one token bucket depth (finite, >= 0) per link")
        for name, v in (("node", node), ("bytes", size), ("latency_ns", lat), ("route_ptr", ptr),
                        ("route_links", links), ("capacity", cap), ("burst", burst)):
            object.__setattr__(self, name, v)

    @classmethod
    def none(cls) -> "Flows":
        z = np.zeros(0, np.int64)
        return cls(z, np.zeros(0), z, np.zeros(1, np.int64), z, np.zeros(0), np.zeros(0))

    def __len__(self) -> int:
        return len(self.node)

    def arrays(self, n_nodes: int) -> "FlowArrays":
        """The flows as the engine's loop takes them, with each of the graph's n_nodes nodes' flow."""
        flow_of = np.full(n_nodes, -1, np.int64)
        if len(self):
            if self.node.min() < 0 or self.node.max() >= n_nodes:
                raise ValueError(f"a flow names a node outside 0..{n_nodes - 1}")
            flow_of[self.node] = np.arange(len(self), dtype=np.int64)
        return FlowArrays(flow_of, self.node, self.bytes, self.latency_ns, self.route_ptr, self.route_links,
                          self.capacity, self.burst)


# Flows as the engine's (numba-compiled) loop takes them: flow_of[node], the node's flow (-1: none), then Flows' arrays
FlowArrays = namedtuple("FlowArrays", ["flow_of"] + [f.name for f in fields(Flows)])


class FlowState(NamedTuple):
    """The moving flows during a replay: active[:n_active] (pos[f]: f's slot, -1: not moving), the bytes each had
    left when the rates were last set (at clock[T_RATES]), its rate and predicted end, the token buckets (tokens
    held, flows crossing each link, since when it has been idle) and scratch for max_min_rates. The counters
    numba cannot keep as mutable scalars of a tuple are in `clock`: N_ACTIVE, VERSION (of the rates: a CHECK
    predicted under an older one is stale), T_RATES. `ended` receives the nodes of the flows end_due ends."""

    active: np.ndarray
    pos: np.ndarray
    left: np.ndarray
    rate: np.ndarray
    pred_end: np.ndarray
    rem_cap: np.ndarray
    n_on: np.ndarray
    touched: np.ndarray
    frozen: np.ndarray
    buckets: bool  # some link has a token bucket
    tokens: np.ndarray
    crossing: np.ndarray
    idle_since: np.ndarray
    ended: np.ndarray
    clock: np.ndarray


N_ACTIVE, VERSION, T_RATES = 0, 1, 2  # slots of FlowState.clock


def flow_state(fl: FlowArrays, t0: int) -> FlowState:
    """Nothing moving yet; every bucket full and idle since t0."""
    n_flows, n_links = len(fl.node), len(fl.capacity)
    clock = np.zeros(3, np.int64)
    clock[T_RATES] = t0
    return FlowState(np.zeros(n_flows, np.int64), np.full(n_flows, -1, np.int64), fl.bytes.copy(),
                     np.zeros(n_flows, np.float64), np.zeros(n_flows, np.int64), np.zeros(n_links, np.float64),
                     np.zeros(n_links, np.int64), np.zeros(n_links, np.int64), np.zeros(n_flows, np.bool_),
                     bool((fl.burst > 0).any()), fl.burst.copy(), np.zeros(n_links, np.int64),
                     np.full(n_links, t0, np.int64), np.zeros(n_flows, np.int64), clock)


def advance(fs: FlowState, t) -> None:
    """Move every active flow's bytes on to time t at the rates last set."""
    dt = t - fs.clock[T_RATES]
    for i in range(fs.clock[N_ACTIVE]):
        f = fs.active[i]
        if dt > 0 and fs.rate[f] < np.inf:
            fs.left[f] = max(fs.left[f] - fs.rate[f] * dt, 0.0)


def activate(fs: FlowState, fl: FlowArrays, f, t) -> None:
    """Flow f starts moving at t: the tokens its bucketed links hold (the least of them) pass at once."""
    n = fs.clock[N_ACTIVE]
    fs.active[n] = f
    fs.pos[f] = n
    fs.clock[N_ACTIVE] = n + 1
    if not fs.buckets:
        return
    passed = np.inf
    for k in range(fl.route_ptr[f], fl.route_ptr[f + 1]):
        lk = fl.route_links[k]
        if fl.burst[lk] > 0:
            if fs.crossing[lk] == 0:
                fs.tokens[lk] = min(fl.burst[lk], fs.tokens[lk] + fl.capacity[lk] * (t - fs.idle_since[lk]))
            passed = min(passed, fs.tokens[lk])
    if passed < np.inf:
        passed = min(passed, fs.left[f])
        fs.left[f] -= passed
        for k in range(fl.route_ptr[f], fl.route_ptr[f + 1]):
            lk = fl.route_links[k]
            if fl.burst[lk] > 0:
                fs.tokens[lk] -= passed
    for k in range(fl.route_ptr[f], fl.route_ptr[f + 1]):
        fs.crossing[fl.route_links[k]] += 1


def end_due(fs: FlowState, fl: FlowArrays, t) -> int:
    """The flows predicted to end by t end: their nodes go to fs.ended[:count], in the order found; returns count."""
    count = 0
    i = 0
    while i < fs.clock[N_ACTIVE]:
        f = fs.active[i]
        if fs.pred_end[f] <= t:
            fs.ended[count] = fl.node[f]
            count += 1
            if fs.buckets:
                for k in range(fl.route_ptr[f], fl.route_ptr[f + 1]):
                    lk = fl.route_links[k]
                    fs.crossing[lk] -= 1
                    if fs.crossing[lk] == 0:
                        fs.idle_since[lk] = t
            n = fs.clock[N_ACTIVE] - 1
            fs.clock[N_ACTIVE] = n
            last = fs.active[n]
            fs.active[i] = last
            fs.pos[last] = i
            fs.pos[f] = -1
        else:
            i += 1
    return count


def predict_ends(fs: FlowState, t) -> int:
    """After new rates at t (max_min_rates into fs.rate): a new rates version and each moving flow's predicted
    end; returns the soonest (int64 max: nothing moves)."""
    fs.clock[T_RATES] = t
    fs.clock[VERSION] += 1
    soonest = np.iinfo(np.int64).max
    for i in range(fs.clock[N_ACTIVE]):
        f = fs.active[i]
        if fs.rate[f] == np.inf or fs.left[f] <= 0.0:
            fs.pred_end[f] = t
        else:
            fs.pred_end[f] = t + np.int64(np.ceil(fs.left[f] / fs.rate[f] - _EPS_NS))
        if fs.pred_end[f] < soonest:
            soonest = fs.pred_end[f]
    return soonest


def max_min_rates(active, n_active, route_ptr, route_links, capacity, rate, rem_cap, n_on, frozen, touched):
    """Max-min fair rates of the active flows (active[:n_active]), by progressive filling, into rate[f].

    rem_cap, n_on, touched (one slot per link) and frozen (one per flow) are scratch arrays; n_on must be
    all zero on entry and is left so. A flow that crosses no link gets rate inf. Deterministic: links
    are visited in the order the active flows first touch them, ties go to the first.
    """
    n_touched = 0
    for i in range(n_active):
        f = active[i]
        frozen[f] = False
        for k in range(route_ptr[f], route_ptr[f + 1]):
            link = route_links[k]
            if n_on[link] == 0:
                touched[n_touched] = link
                n_touched += 1
                rem_cap[link] = capacity[link]
            n_on[link] += 1
    left = n_active
    while left > 0:
        best = np.inf
        bottleneck = -1
        for j in range(n_touched):
            link = touched[j]
            if n_on[link] > 0:
                share = rem_cap[link] / n_on[link]
                if share < best:
                    best = share
                    bottleneck = link
        if bottleneck < 0:  # the flows left cross no link
            for i in range(n_active):
                f = active[i]
                if not frozen[f]:
                    rate[f] = np.inf
                    frozen[f] = True
            break
        for i in range(n_active):
            f = active[i]
            if frozen[f]:
                continue
            crosses = False
            for k in range(route_ptr[f], route_ptr[f + 1]):
                if route_links[k] == bottleneck:
                    crosses = True
                    break
            if not crosses:
                continue
            rate[f] = best
            frozen[f] = True
            left -= 1
            for k in range(route_ptr[f], route_ptr[f + 1]):
                link = route_links[k]
                rem_cap[link] = max(rem_cap[link] - best, 0.0)
                n_on[link] -= 1
    for j in range(n_touched):  # leave n_on all zero for the next call
        n_on[touched[j]] = 0


def rates(flows: Flows, active) -> np.ndarray:
    """Max-min fair rate (bytes/ns) of each flow in `active` (indices into flows), in that order."""
    active = np.asarray(active, np.int64)
    n_links = len(flows.capacity)
    rate = np.zeros(len(flows), np.float64)
    max_min_rates(active, len(active), flows.route_ptr, flows.route_links, flows.capacity, rate,
                  np.zeros(n_links), np.zeros(n_links, np.int64), np.zeros(len(flows), np.bool_),
                  np.zeros(n_links, np.int64))
    return rate[active]
