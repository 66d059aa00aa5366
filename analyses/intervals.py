"""The union of half-open intervals [start, end): the one definition every layer above uses (the dependency
graph's busy spans, doctor's data-loading and pipeline figures, the pipeline what-if's backward time).

Touching intervals stay apart: [0, 5) and [5, 9) are two spans, not one. The union's length is the same
either way; the spans themselves are what the dependency graph cuts a thread's time into, and its replay
figures were fitted with touching spans apart. The SQL twin is analyses/_islands.sql (same rule, checked
against this one by tests/test_intervals.py).
"""
from __future__ import annotations

import numpy as np


def union_spans(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals [start, end) as (starts, ends), sorted and disjoint; the input in any order
    (a stable sort by start: input already sorted by start keeps its order, ties included)."""
    start, end = np.asarray(start), np.asarray(end)
    if not len(start):
        return start[:0], end[:0]
    if len(start) > 1 and (start[1:] < start[:-1]).any():
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    run_end = np.maximum.accumulate(end)
    new = np.ones(len(start), bool)
    new[1:] = start[1:] >= run_end[:-1]
    heads = np.flatnonzero(new)
    return start[heads], np.maximum.reduceat(end, heads)


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Total length of the union of the intervals [start, end), in their unit (ns by the callers' names)."""
    s, e = union_spans(start, end)
    return int((e - s).sum())
