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
    heads = _island_heads(start, end)
    return start[heads], np.maximum.reduceat(end, heads)


def _island_heads(start: np.ndarray, end: np.ndarray) -> np.ndarray:
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


class GroupedIntervals:
    """The intervals [start, end) of many groups (group: integers) at once, for each group's union (union_ns's,
    each group alone). One sort, by group then start: every time is shifted by its group's place times the whole
    span of the times, so that one running maximum over all the groups never carries a group's end into the next
    (union_spans' islands, by the same code). Groups come out in ascending order: `groups`, and per group `count`,
    `first_start`, `last_end` and union_ns(). Where the shifted times would not fit in 64 bits (millions of groups
    over hours), group by group."""

    def __init__(self, group: np.ndarray, start: np.ndarray, end: np.ndarray):
        group, start, end = (np.asarray(a, np.int64) for a in (group, start, end))
        self._shifted = bool(len(start))
        if self._shifted:
            lo = min(int(start.min()), int(end.min()))
            span = max(int(start.max()), int(end.max())) - lo + 1
            g0 = int(group.min())
            self._shifted = (int(group.max()) - g0 + 1) * span < 2 ** 62
        if not self._shifted:  # (or no intervals) a lexsort, and group by group
            self._order = np.lexsort((start, group))
            self._group, self._s, self._e = group[self._order], start[self._order], end[self._order]
            self._firsts = np.flatnonzero(np.r_[True, self._group[1:] != self._group[:-1]]) if len(start) else \
                np.zeros(0, np.int64)
            self.groups = self._group[self._firsts]
            self.count = np.diff(np.r_[self._firsts, len(start)]).astype(np.int64)
            self.first_start = self._s[self._firsts]
            self.last_end = np.maximum.reduceat(self._e, self._firsts) if len(start) else np.zeros(0, np.int64)
            return
        shift = group - g0
        shift *= span
        shift -= lo
        s = shift + start
        self._order = order = np.argsort(s)
        self._s = s = s[order]
        shift += end
        self._e = e = shift[order]
        del shift
        gs = s // span
        self._firsts = firsts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        self.groups = gs[firsts] + g0
        self.count = np.diff(np.r_[firsts, len(s)])
        base = (self.groups - g0) * span - lo
        self.first_start = s[firsts] - base
        self.last_end = np.maximum.reduceat(e, firsts) - base

    def union_ns(self, mask: np.ndarray | None = None) -> np.ndarray:
        """Each group's union length, ns (0 where mask leaves a group none); mask: which intervals count, in the
        order the intervals were given."""
        out = np.zeros(len(self.groups), np.int64)
        s, e = self._s, self._e
        if mask is not None:
            keep = np.asarray(mask, bool)[self._order]
            s, e = s[keep], e[keep]
        if not len(s):
            return out
        if not self._shifted:
            group = self._group if mask is None else self._group[keep]
            cut = np.flatnonzero(group[1:] != group[:-1]) + 1
            for a, b in zip(np.r_[0, cut], np.r_[cut, len(s)]):
                out[np.searchsorted(self.groups, group[a])] = union_ns(s[a:b], e[a:b])
            return out
        heads = _island_heads(s, e)
        lengths = np.maximum.reduceat(e, heads) - s[heads]
        place = np.searchsorted(self._s[self._firsts], s[heads], side="right") - 1  # each island's group
        firsts = np.flatnonzero(np.r_[True, place[1:] != place[:-1]])
        out[place[firsts]] = np.add.reduceat(lengths, firsts)
        return out
