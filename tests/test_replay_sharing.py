"""Flows over shared links in the engine: max-min fairness by progressive filling, and transfer ends the
engine finds while it runs. Hand-built cases with exact finish times, and properties on random ones."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine import Engine
from replay.sharing import Flows, rates


def _flows(nodes, sizes, routes, capacity, latency=None):
    ptr = np.concatenate([[0], np.cumsum([len(r) for r in routes])]).astype(np.int64)
    links = np.array([x for r in routes for x in r], np.int64)
    return Flows(node=nodes, bytes=sizes, latency_ns=latency if latency is not None else [0] * len(nodes),
                 route_ptr=ptr, route_links=links, capacity=capacity)


def _star(starts, compiled=True):
    """origin -> node i+1 after starts[i] ns: one node per flow, nothing after them."""
    n = len(starts) + 1
    src = [0] * len(starts)
    dst = list(range(1, n))
    return Engine(n, src, dst, [False] * len(starts), starts, source=0, compiled=compiled)


# ---- by hand

def test_one_flow_alone_takes_its_alpha_beta_time():
    e = _star([10])
    fl = _flows([1], [1000.0], [[0]], [0.5], latency=[7])  # 0.5 byte/ns = 0.5 GB/s
    s = e.run([0, 999_999], flows=fl)  # the node's own duration is not used
    assert s.start_ns[1] == 10 and s.end_ns[1] == 10 + 7 + 2000


def test_a_flow_that_joins_halfway_shares_the_link_from_then_on():
    # A: 100 bytes from 0; B: 100 bytes from 50, one link of 1 byte/ns. A alone moves 50, then both move at
    # 0.5: A's last 50 take 100 (ends 150), B has 50 left then and alone ends at 200.
    e = _star([0, 50])
    s = e.run([0, 0, 0], flows=_flows([1, 2], [100.0, 100.0], [[0], [0]], [1.0]))
    assert s.end_ns[1:].tolist() == [150, 200]


def test_n_equal_flows_on_one_link_each_get_a_share_of_one_nth():
    for n in (2, 3, 5):
        e = _star([0] * n)
        s = e.run([0] * (n + 1), flows=_flows(list(range(1, n + 1)), [60.0] * n, [[0]] * n, [2.0]))
        assert s.end_ns[1:].tolist() == [30 * n] * n


def test_max_min_gives_the_unbottlenecked_flow_what_is_left():
    # X crosses links 0 (1 byte/ns) and 1 (2 byte/ns), Y link 0, Z link 1: link 0 binds first at 0.5 each,
    # then Z takes the rest of link 1: 1.5
    fl = _flows([1, 2, 3], [1.0] * 3, [[0, 1], [0], [1]], [1.0, 2.0])
    assert rates(fl, [0, 1, 2]).tolist() == [0.5, 0.5, 1.5]


def test_a_token_bucket_lets_a_flow_past_the_rate_by_what_it_holds_and_refills_while_the_link_is_idle():
    # one link of 1 byte/ns behind a 1000-byte bucket (full at the start). A: 3000 bytes from 0 takes the 1000
    # tokens at once, moves 2000 (ends 2000). B: 1500 bytes from 2500: the link idled 500 ns, the bucket holds 500:
    # B moves 1000 (ends 3500). C: 400 bytes from 3500 + 2000: the bucket is full again (capped at 1000): C passes
    # at once and leaves 600. D: 800 bytes from 5500 as well, crossing the bucketed link and a plain one of 4 bytes/ns
    # (which holds no tokens and does not stop them): the link is busy, no refill: D takes the 600 and moves 200
    # (ends 5700)
    fl = Flows(node=[1, 2, 3, 4], bytes=[3000.0, 1500.0, 400.0, 800.0], latency_ns=[0, 0, 0, 0],
               route_ptr=[0, 1, 2, 3, 5], route_links=[0, 0, 0, 0, 1], capacity=[1.0, 4.0], burst=[1000.0, 0.0])
    for compiled in (True, False):
        s = _star([0, 2500, 5500, 5500], compiled=compiled).run([0] * 5, flows=fl)
        assert s.end_ns[1:].tolist() == [2000, 3500, 5500, 5700], compiled
    # no bucket: the link's rate alone (A alone to 2500 with 500 left, then A and B at 0.5 each: A ends 3500, B
    # alone after; C and D at 0.5 each until C's 400 are done at 6300, D's last 400 alone)
    plain = Flows(fl.node, fl.bytes, fl.latency_ns, fl.route_ptr, fl.route_links, fl.capacity)
    s = _star([0, 2500, 5500, 5500]).run([0] * 5, flows=plain)
    assert s.end_ns[1:].tolist() == [3500, 4500, 6300, 6700]
    with pytest.raises(ValueError, match="one token bucket depth"):
        Flows(fl.node, fl.bytes, fl.latency_ns, fl.route_ptr, fl.route_links, fl.capacity, burst=[1.0])


def test_a_flow_without_links_or_bytes_lasts_its_latency():
    e = _star([5, 5])
    fl = _flows([1, 2], [1e9, 0.0], [[], [0]], [1.0], latency=[3, 4])
    s = e.run([0, 0, 0], flows=fl)
    assert s.end_ns[1:].tolist() == [8, 9]


def test_a_flow_end_releases_what_depends_on_it():
    # origin -> 1 (flow, 100 bytes at 1 byte/ns) -> 2 (dur 5): 2 starts when the flow has ended
    e = Engine(3, [0, 1], [1, 2], [False, True], [0, 0], source=0)
    s = e.run([0, 0, 5], flows=_flows([1], [100.0], [[0]], [1.0]))
    assert s.start_ns.tolist() == [0, 0, 100] and s.end_ns.tolist() == [0, 100, 105]


def test_without_flows_the_plain_loop_is_unchanged():
    src, dst = [0, 0, 1, 2, 1], [1, 2, 3, 3, 4]
    e = Engine(5, src, dst, [True, True, True, True, False], [0, 0, 0, 2, 1], source=0, t0_ns=100)
    a = e.run([0, 5, 7, 3, 4])
    b = e.run([0, 5, 7, 3, 4], flows=Flows.none())
    assert a.start_ns.tolist() == b.start_ns.tolist() == [100, 100, 100, 109, 101]
    assert a.end_ns.tolist() == b.end_ns.tolist()


def test_bad_flows_are_refused():
    with pytest.raises(ValueError, match="capacities"):
        _flows([1], [1.0], [[0]], [0.0])
    with pytest.raises(ValueError, match="outside"):
        _flows([1], [1.0], [[3]], [1.0])
    with pytest.raises(ValueError, match="at most one flow"):
        _flows([1, 1], [1.0, 1.0], [[0], [0]], [1.0])
    with pytest.raises(ValueError, match="node outside"):
        _star([0]).run([0, 0], flows=_flows([7], [1.0], [[0]], [1.0]))


# ---- properties

@st.composite
def instances(draw):
    n_links = draw(st.integers(1, 5))
    n = draw(st.integers(1, 8))
    routes = [draw(st.lists(st.integers(0, n_links - 1), min_size=0, max_size=n_links, unique=True)) for _ in range(n)]
    caps = [draw(st.floats(0.05, 10.0)) for _ in range(n_links)]
    sizes = [draw(st.floats(0.0, 5000.0)) for _ in range(n)]
    starts = [draw(st.integers(0, 2000)) for _ in range(n)]
    lat = [draw(st.integers(0, 50)) for _ in range(n)]
    return starts, _flows(list(range(1, n + 1)), sizes, routes, caps, latency=lat)


@settings(max_examples=60, deadline=None)
@given(instances())
def test_rates_never_exceed_a_link_and_every_flow_has_a_saturated_bottleneck(inst):
    _starts, fl = inst
    active = np.arange(len(fl))
    r = rates(fl, active)
    load = np.zeros(len(fl.capacity))
    for f in active:
        for link in fl.route_links[fl.route_ptr[f]:fl.route_ptr[f + 1]]:
            load[link] += r[f]
    assert (load <= fl.capacity * (1 + 1e-9)).all()  # no link above capacity
    for f in active:
        route = fl.route_links[fl.route_ptr[f]:fl.route_ptr[f + 1]]
        if not len(route):
            assert r[f] == np.inf
            continue
        # work-conserving and max-min: some link of the flow is full, and no flow on it gets more
        def is_bottleneck(link):
            on = [g for g in active if link in fl.route_links[fl.route_ptr[g]:fl.route_ptr[g + 1]]]
            return load[link] >= fl.capacity[link] * (1 - 1e-9) and r[f] >= max(r[g] for g in on) * (1 - 1e-9)
        assert any(is_bottleneck(link) for link in route)


@settings(max_examples=40, deadline=None)
@given(instances())
def test_flows_end_no_earlier_than_alone_and_runs_are_bit_identical_compiled_or_not(inst):
    starts, fl = inst
    dur = [0] * (len(starts) + 1)
    a = _star(starts, compiled=True).run(dur, flows=fl)
    b = _star(starts, compiled=True).run(dur, flows=fl)
    c = _star(starts, compiled=False).run(dur, flows=fl)
    assert np.array_equal(a.end_ns, b.end_ns) and np.array_equal(a.end_ns, c.end_ns)
    assert np.array_equal(a.start_ns, c.start_ns)
    for f in range(len(fl)):
        route = fl.route_links[fl.route_ptr[f]:fl.route_ptr[f + 1]]
        alone = 0 if not len(route) or fl.bytes[f] == 0 else np.ceil(fl.bytes[f] / fl.capacity[route].min() - 1e-6)
        assert a.end_ns[f + 1] >= starts[f] + fl.latency_ns[f] + alone


@settings(max_examples=40, deadline=None)
@given(instances())
def test_the_bytes_moved_add_up_and_the_links_work_while_flows_wait(inst):
    # one link, every flow on it: the link is never idle while a flow moves, so the last end is the
    # total bytes / capacity after the last flow became ready, at most (work conservation)
    starts, fl = inst
    one = _flows(fl.node, fl.bytes, [[0]] * len(fl), [fl.capacity[0]], latency=[0] * len(fl))
    s = _star(starts).run([0] * (len(starts) + 1), flows=one)
    total = float(np.sum(fl.bytes))
    last_end = s.end_ns[1:].max()
    assert last_end <= max(starts) + np.ceil(total / fl.capacity[0]) + len(fl)
    assert last_end >= min(starts) + total / fl.capacity[0] - len(fl)


# ---- pools: work served by whichever server is free, in FIFO order

def test_a_pool_of_two_serves_three_jobs_in_the_order_they_became_ready():
    # jobs ready at 0, 1, 2 (durations 10, 10, 10) on 2 servers: the third waits for the first to end
    e = _star([0, 1, 2])
    s = e.run([0, 10, 10, 10], pools=([-1, 0, 0, 0], [-1, 0, 0, 0], [2]))
    assert s.start_ns[1:].tolist() == [0, 1, 10] and s.end_ns[1:].tolist() == [10, 11, 20]


def test_a_server_freed_at_a_time_serves_work_ready_at_that_time():
    e = _star([0, 5])
    s = e.run([0, 5, 3], pools=([-1, 0, 0], [-1, 0, 0], [1]))
    assert s.start_ns[1:].tolist() == [0, 5] and s.end_ns[1:].tolist() == [5, 8]


def test_pool_work_that_is_also_a_flow_starts_moving_when_served():
    # one server; the second job (a flow of 100 bytes at 1 byte/ns) waits for the first (dur 30)
    e = _star([0, 0])
    s = e.run([0, 30, 0], flows=_flows([2], [100.0], [[0]], [1.0]), pools=([-1, 0, 0], [-1, 0, 0], [1]))
    assert s.start_ns[1:].tolist() == [0, 30] and s.end_ns[1:].tolist() == [30, 130]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=12), st.integers(1, 4), st.data())
def test_a_pool_never_runs_more_than_its_servers_and_idles_only_with_an_empty_queue(starts, k, data):
    durs = [data.draw(st.integers(0, 40)) for _ in starts]
    n = len(starts) + 1
    a = _star(starts).run([0, *durs], pools=([-1] + [0] * len(starts), [-1] + [0] * len(starts), [k]))
    b = _star(starts, compiled=False).run([0, *durs], pools=([-1] + [0] * len(starts), [-1] + [0] * len(starts), [k]))
    assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
    st_, en = a.start_ns[1:], a.end_ns[1:]
    for t in set(st_.tolist()) | set(en.tolist()):
        running = int(((st_ <= t) & (en > t)).sum())
        assert running <= k
        waiting = int(((np.array(starts) <= t) & (st_ > t)).sum())
        assert waiting == 0 or running == k  # work-conserving: nobody waits while a server is free
    assert all(s >= r for s, r in zip(st_, starts))
    assert n == len(a.start_ns)


def test_a_job_holds_its_server_from_its_first_node_to_its_last():
    # two jobs of two nodes each (take at 1 / 3, give back at 2 / 4), one server: the second job's first node
    # waits until the first job's second node has ended
    e = Engine(5, [0, 1, 0, 3], [1, 2, 3, 4], [False, True, False, True], [0, 0, 0, 0], source=0)
    s = e.run([0, 10, 5, 1, 1], pools=([-1, 0, -1, 0, -1], [-1, -1, 0, -1, 0], [1]))
    assert s.start_ns.tolist() == [0, 0, 10, 15, 16] and s.end_ns[4] == 17
    with pytest.raises(ValueError, match="as many servers"):
        e.run([0, 1, 1, 1, 1], pools=([-1, 0, -1, 0, -1], [-1, -1, 0, -1, -1], [1]))
