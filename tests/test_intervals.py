"""The union of intervals (analyses/intervals.py), the one definition the dependency graph, doctor and the
pipeline what-if use, and its SQL twin (analyses/_islands.sql) keeping the same touching rule."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from analyses._sql import sql_text
from analyses.intervals import GroupedIntervals, covered_ns, union_ns, union_spans


def _spans(start, end):
    s, e = union_spans(np.array(start, np.int64), np.array(end, np.int64))
    return list(zip(s.tolist(), e.tolist()))


@pytest.mark.parametrize("start, end, spans", [
    ([], [], []),
    ([0, 5], [5, 9], [(0, 5), (5, 9)]),                 # touching: two spans
    ([0, 2], [10, 4], [(0, 10)]),                       # nested
    ([0, 3], [5, 9], [(0, 9)]),                         # overlapping
    ([6, 0, 3, 20], [8, 4, 5, 21], [(0, 5), (6, 8), (20, 21)]),  # unsorted
    ([0, 1, 2], [10, 3, 12], [(0, 12)]),                # a later interval outlasting a nested one
])
def test_union_spans(start, end, spans):
    assert _spans(start, end) == spans
    assert union_ns(np.array(start, np.int64), np.array(end, np.int64)) == sum(e - s for s, e in spans)


def test_touching_or_not_the_length_is_the_same():
    assert union_ns(np.array([0, 5]), np.array([5, 9])) == union_ns(np.array([0]), np.array([9])) == 9


def test_sorted_input_keeps_its_order_ties_included():
    # the dependency graph passes spans sorted by start; a zero-length one before a longer one at the same start
    assert _spans([0, 0, 7], [0, 5, 8]) == [(0, 0), (0, 5), (7, 8)]


@pytest.mark.parametrize("window, ns", [
    ((0, 50), 25),   # every span
    ((3, 15), 7),    # the tail of one, the head of the next
    ((12, 35), 13),
    ((0, 5), 5),     # exactly one span
    ((25, 28), 0),   # between spans
    ((45, 60), 0),   # after them all
    ((-5, 2), 2),    # before them all, into the first
    ((12, 14), 2),   # inside one
])
def test_covered_ns_is_the_spans_time_inside_each_window(window, ns):
    start, end = np.array([0, 10, 30]), np.array([5, 20, 40])
    got = covered_ns(start, end, np.array([window[0]]), np.array([window[1]]))
    assert got.tolist() == [ns]
    # the same as the union of the spans clipped to the window
    assert ns == union_ns(np.clip(start, *window), np.clip(end, *window))
    assert covered_ns(start[:0], end[:0], np.array([window[0]]), np.array([window[1]])).tolist() == [0]


def test_the_sql_islands_follow_the_same_rule():
    rng = np.random.default_rng(3)
    start = rng.integers(0, 200, 300)
    end = start + rng.integers(1, 12, 300)  # positive lengths, many touching and overlapping
    con = duckdb.connect()
    con.register("iv", {"ts_ns": start, "end_ns": end})
    text = ("WITH _layers AS (SELECT 'l' AS layer, 'gpu' AS timeline, 0 AS rank, NULL::BIGINT AS step, ts_ns, end_ns "
            "FROM iv),\n" + sql_text("_islands").rstrip().rstrip(",")
            + "\nSELECT start_ns, end_ns, n FROM _islands ORDER BY start_ns")
    rows = con.execute(text).fetchall()
    assert [(s, e) for s, e, _ in rows] == _spans(start, end)
    assert sum(n for _, _, n in rows) == len(start)


def _grouped_by_hand(group, start, end):
    out = {}
    for g in sorted(set(group.tolist())):
        m = group == g
        out[g] = (int(m.sum()), int(start[m].min()), int(end[m].max()), union_ns(start[m], end[m]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_grouped_intervals_are_each_groups_union(seed):
    # groups in any order, of any size, overlapping each other in time: each group's figures are its own alone
    rng = np.random.default_rng(seed)
    n = 2000
    group = rng.choice(np.array([3, 7, 8, 40, 41, 1000]), n)
    start = rng.integers(10**12, 10**12 + 5000, n)
    end = start + rng.integers(0, 30, n)  # zero-length ones, touching and nested ones
    compute = rng.random(n) < 0.4
    iv = GroupedIntervals(group, start, end)
    want = _grouped_by_hand(group, start, end)
    assert iv.groups.tolist() == sorted(want)
    assert list(zip(iv.count.tolist(), iv.first_start.tolist(), iv.last_end.tolist(), iv.union_ns().tolist())) == \
        list(want.values())
    masked = {g: (union_ns(start[(group == g) & compute], end[(group == g) & compute])) for g in want}
    assert iv.union_ns(compute).tolist() == list(masked.values())


def test_grouped_intervals_where_the_shifted_times_would_not_fit():
    # two groups over 2^61 ns apart: no shift fits 64 bits, so they are taken group by group; the same figures
    big = 2 ** 61
    group = np.array([5, 5, 9, 9, 9])
    start = np.array([0, 3, big, big + 1, big + 10])
    end = np.array([5, 4, big + 2, big + 3, big + 11])
    iv = GroupedIntervals(group, start, end)
    assert iv.groups.tolist() == [5, 9]
    assert iv.union_ns().tolist() == [5, 4]
    assert iv.union_ns(np.array([False, True, False, True, True])).tolist() == [1, 3]
    assert iv.first_start.tolist() == [0, big] and iv.last_end.tolist() == [5, big + 11]


def test_grouped_intervals_of_nothing():
    iv = GroupedIntervals(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(iv.groups) == 0 and len(iv.union_ns()) == 0
