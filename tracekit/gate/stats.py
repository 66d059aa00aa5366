"""Two-sample statistics for the gate, in numpy only (no scipy dependency).

Mann-Whitney U: rank-based, so one outlier step (a GC pause, a checkpoint) cannot move it the way
it moves a mean; ties get the standard variance correction; the p-value comes from the normal
approximation with a continuity correction. Deterministic: no random numbers at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MannWhitney:
    u_candidate: float  # U statistic of the candidate sample (pairs where candidate > baseline; ties 1/2)
    z: float
    p_value: float      # two-sided
    rank_biserial: float  # effect size in [-1, 1]: +1 when every candidate value exceeds every baseline value


def _ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) of values, and the sizes of the tie groups."""
    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    # boundaries of runs of equal values
    starts = np.flatnonzero(np.r_[True, sorted_vals[1:] != sorted_vals[:-1]])
    sizes = np.diff(np.r_[starts, len(values)])
    avg = starts + (sizes + 1) / 2.0  # mean of 1-based ranks start+1 .. start+size
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(avg, sizes)
    return ranks, sizes


def mann_whitney(baseline, candidate) -> MannWhitney:
    x = np.asarray(baseline, dtype=float)
    y = np.asarray(candidate, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney needs two non-empty samples")
    ranks, ties = _ranks(np.concatenate([x, y]))
    u_y = ranks[n1:].sum() - n2 * (n2 + 1) / 2.0
    mean_u = n1 * n2 / 2.0
    n = n1 + n2
    tie_term = float((ties ** 3 - ties).sum())
    var_u = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var_u <= 0:  # every value equal: no evidence of any difference
        return MannWhitney(u_y, 0.0, 1.0, 0.0)
    diff = u_y - mean_u
    # continuity correction towards the mean: U moves in steps of 1/2 or 1
    z = math.copysign(max(abs(diff) - 0.5, 0.0), diff) / math.sqrt(var_u)
    p = min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))
    return MannWhitney(u_y, z, p, 2.0 * u_y / (n1 * n2) - 1.0)


def smallest_p_value(n1: int, n2: int) -> float:
    """The smallest two-sided p the test can reach with these sample sizes (complete separation,
    no ties, under the same normal approximation). Above alpha, the test cannot ever be significant,
    so the gate says so and decides on the threshold alone."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return mann_whitney(np.arange(n1), np.arange(n1, n1 + n2)).p_value
