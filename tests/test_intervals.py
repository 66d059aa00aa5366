"""The union of intervals (analyses/intervals.py), the one definition the dependency graph, doctor and the
pipeline what-if use, and its SQL twin (analyses/_islands.sql) keeping the same touching rule."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from analyses._sql import sql_text
from analyses.intervals import union_ns, union_spans


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
