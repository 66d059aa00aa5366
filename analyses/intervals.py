"""The union of half-open intervals [start, end): the one definition every layer above uses (the dependency
graph's busy spans, doctor's data-loading and pipeline figures, the pipeline what-if's backward time), and the
temporal breakdown's unions of every rank at once (GroupedIntervals).

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
    heads = island_heads(start, end)
    return start[heads], np.maximum.reduceat(end, heads)


def island_heads(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Where each island begins in intervals sorted by start: an interval that starts once every earlier one has
    ended (the running maximum of the ends)."""
    run_end = np.maximum.accumulate(end)
    new = np.ones(len(start), bool)
    new[1:] = start[1:] >= run_end[:-1]
    return np.flatnonzero(new)


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Total length of the union of the intervals [start, end), in their unit (ns by the callers' names)."""
    s, e = union_spans(start, end)
    return int((e - s).sum())


def covered_ns(start: np.ndarray, end: np.ndarray, win_start: np.ndarray, win_end: np.ndarray) -> np.ndarray:
    """Per window [win_start, win_end): how much of it the spans [start, end) cover; the spans sorted and disjoint
    (union_spans' output, or the outermost events of one thread). In the spans' unit (ns by the callers' names)."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if not len(start):
        return np.zeros(len(np.asarray(win_start)), np.int64)
    before = np.concatenate(([0], np.cumsum(end - start)))  # covered before span i starts: before[i]

    def upto(t):  # covered before t
        t = np.asarray(t, np.int64)
        k = np.searchsorted(start, t, side="right")  # spans begun by t
        last = np.maximum(k - 1, 0)
        inside = np.where(k > 0, np.minimum(end[last], t) - start[last], 0)
        return before[last] + np.maximum(inside, 0)

    return np.maximum(upto(win_end) - upto(win_start), 0)


def shift_apart(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """The intervals of many groups (group: integers) as one sequence that one sort and one running maximum can cross
    without carrying a group's end into the next: each group's times shifted past the previous group's (its place
    times the whole span of the times, so lengths within a group stay ns), or, where that would not fit in 64 bits
    (a clock jump, millions of groups over hours), every time replaced by its order among all times, offset per
    group (the order within a group kept, lengths not). Returns (start, end, whether they are ns)."""
    group, start, end = (np.asarray(a, np.int64) for a in (group, start, end))
    if not len(start):
        return start.copy(), end.copy(), True
    t0 = min(int(start.min()), int(end.min()))
    span = max(int(start.max()), int(end.max())) - t0 + 1
    g0 = int(group.min())
    if (int(group.max()) - g0 + 1) * span < 2 ** 62:
        shift = group - g0
        shift *= span
        shift -= t0
        return start + shift, end + shift, True
    both = np.unique(np.r_[start, end])
    shift = (group - g0) * (len(both) + 1)
    return np.searchsorted(both, start) + shift, np.searchsorted(both, end) + shift, False


class GroupedIntervals:
    """The intervals [start, end) of many groups (group: integers) at once, for each group's union (union_ns's,
    each group alone): one sort and one running maximum over the times shift_apart makes, union_spans' islands by
    the same code. Groups come out in ascending order: `groups`, and per group `count`, `first_start`, `last_end`
    and union_ns()."""

    def __init__(self, group: np.ndarray, start: np.ndarray, end: np.ndarray):
        group, start, end = (np.asarray(a, np.int64) for a in (group, start, end))
        s_key, e_key, in_ns = shift_apart(group, start, end)
        self._order = order = np.argsort(s_key)
        self._s, self._e = s_key[order], e_key[order]  # the keys the islands are found on
        del s_key, e_key
        self._group = group[order]
        self._firsts = firsts = np.flatnonzero(np.r_[True, self._group[1:] != self._group[:-1]]) if len(order) \
            else np.zeros(0, np.int64)
        self.groups = self._group[firsts]
        self.count = np.diff(np.r_[firsts, len(order)]).astype(np.int64)
        self.first_start = start[order[firsts]]
        # what lengths are taken on: the keys where they are shifted ns (a group's shift cancels), else the times
        self._in_ns = in_ns
        self._len_s, self._len_e = (self._s, self._e) if self._in_ns else (start[order], end[order])
        shift = self._len_s[firsts] - self.first_start
        self.last_end = (np.maximum.reduceat(self._len_e, firsts) - shift) if len(order) else np.zeros(0, np.int64)

    def union_ns(self, mask: np.ndarray | None = None) -> np.ndarray:
        """Each group's union length, ns (0 where mask leaves a group none); mask: which intervals count, in the
        order the intervals were given."""
        out = np.zeros(len(self.groups), np.int64)
        s, e, ls, le, g = self._s, self._e, self._len_s, self._len_e, self._group
        if mask is not None:
            keep = np.asarray(mask, bool)[self._order]
            s, e, g = s[keep], e[keep], g[keep]
            ls, le = (s, e) if self._in_ns else (ls[keep], le[keep])
        if not len(s):
            return out
        heads = island_heads(s, e)
        lengths = np.maximum.reduceat(le, heads) - ls[heads]
        place = np.searchsorted(self.groups, g[heads])  # each island's group
        firsts = np.flatnonzero(np.r_[True, place[1:] != place[:-1]])
        out[place[firsts]] = np.add.reduceat(lengths, firsts)
        return out
