"""Communication model for replay: how long each collective's transfer takes, measured or predicted.

A collective's measured duration splits into waiting (for the last participant) and transfer (after
it arrived); the engine asks a CommModel for the transfer part only. Models here:

- MeasuredComm: the measured transfer, unchanged.
- AlphaBetaModel: alpha-beta costs (latency alpha, inverse bandwidth beta) per link class and
  algorithm (ring / tree / hierarchical / auto), absolute, from link parameters.
- CalibratedModel: alpha and beta per process-group class, fitted from the run's own collectives or from
  an nccl-tests curve (replay/calibration.py).
- WhatIfComm: a calibrated model under changed links / algorithm. 'ratio' mode scales each measured
  transfer by (cost under the new parameters / cost under the fitted ones), so the unchanged scenario
  returns the measured transfers exactly; 'absolute' mode returns the model's own prediction.

Every model maps a DataFrame of collective instances (one row each, columns in COLL_COLUMNS) to an
int64 array of transfer times in ns, in row order. The costs (link parameters, per-algorithm coefficients)
are replay/costs.py's. Nothing reads the clock; rng is accepted for models
with noise and ignored by the deterministic ones here.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pandas as pd

from .costs import (ALGORITHMS, DEFAULT_LINKS, LINK_CLASSES, CollRows, Link, LinkOverride, Params, check_links,
                    coll_rows, cost_terms, to_ns)


class CommModel(Protocol):
    notes: list[str]  # what the model assumed that a reader of the replay should know

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        """Transfer time (ns, int64) per row of colls, in row order."""
        ...


# ---------------------------------------------------------------------------------------------------
# Models


class MeasuredComm:
    """The measured transfer time, unchanged (replay of the run as it happened)."""

    @property
    def notes(self) -> list[str]:
        return []

    def with_links(self, links: dict) -> "MeasuredComm":
        if any(isinstance(v, Link) or (isinstance(v, LinkOverride) and (v.bandwidth_gbps or v.latency_us is not None))
               for v in links.values()):
            raise ValueError("measured transfers cannot be re-costed on other links: calibrate a model first")
        return self

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        return colls["measured_transfer_ns"].to_numpy(dtype="int64", na_value=0).copy()


@dataclass
class AlphaBetaModel:
    """Absolute alpha-beta model from link parameters (no calibration). Collectives whose bytes are
    unknown or whose op is not modelled keep their measured transfer: there is nothing to predict from."""
    links: dict[str, Link] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    algorithm: str = "ring"
    gpus_per_node: int | None = None

    def __post_init__(self):
        given = dict(self.links or {})
        check_links(given)
        self.links = {c: (given[c].over(DEFAULT_LINKS[c]) if isinstance(given.get(c), LinkOverride)
                          else given.get(c, DEFAULT_LINKS[c])) for c in LINK_CLASSES}
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")

    @property
    def notes(self) -> list[str]:
        return []  # nothing fitted, nothing to say

    def _params(self, k: int) -> Params:
        i, e = self.links["intra_node"], self.links["inter_node"]
        return Params(np.full(k, i.alpha_ns), np.full(k, i.beta_ns_per_byte),
                      np.full(k, e.alpha_ns), np.full(k, e.beta_ns_per_byte))

    def with_links(self, links: dict) -> "AlphaBetaModel":
        check_links(links)
        merged = {c: (links[c].over(self.links[c]) if isinstance(links.get(c), LinkOverride)
                      else links.get(c, self.links[c])) for c in LINK_CLASSES}
        return replace(self, links=merged)

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        r = coll_rows(colls)
        A, B, modelled = cost_terms(r, self.algorithm, self._params(len(r)), self.gpus_per_node)
        pred = to_ns(A + B * np.nan_to_num(r.n))
        keep = ~modelled | np.isnan(r.n)
        return np.where(keep, r.measured, pred)


# ---------------------------------------------------------------------------------------------------
# The calibrated model (fitted by replay/calibration.py)


@dataclass(frozen=True)
class ClassFit:
    """alpha (ns) and beta (ns/byte) of one process-group class, as fitted."""
    key: str
    link_class: str              # intra_node | inter_node
    alpha_ns: float
    beta_ns_per_byte: float
    n_rows: int                  # rows with known bytes used in the fit
    alpha_source: str            # fit | pooled | zero (alpha not separable: see CalibratedModel.notes)
    rel_rms: float               # root-mean-square relative residual of the fit

    @property
    def bandwidth_gbps(self) -> float:
        return 1.0 / self.beta_ns_per_byte if self.beta_ns_per_byte > 0 else math.inf


def class_keys(colls: pd.DataFrame) -> np.ndarray:
    """Process-group class of each row: 'pg:<name>' when the process group is named, else
    'size<p>/hosts<N>' (N '?' when unknown), with '/cpu' appended for CPU-timeline (gloo) groups."""
    r = coll_rows(colls)
    return class_keys_of(r)


def class_keys_of(r: CollRows) -> np.ndarray:
    out = np.empty(len(r), dtype=object)
    for i in range(len(r)):
        pg = r.pg[i]
        if pg is not None and str(pg) != "":
            out[i] = f"pg:{pg}"
        else:
            h = "?" if np.isnan(r.hosts[i]) else str(int(r.hosts[i]))
            p = "?" if np.isnan(r.p[i]) else str(int(r.p[i]))
            out[i] = f"size{p}/hosts{h}" + ("/cpu" if r.timeline[i] == "cpu" else "")
    return out


@dataclass
class CalibratedModel:
    """alpha/beta fitted per process-group class (and pooled per link class) for one flat algorithm.
    transfer_ns() is its absolute prediction; WhatIfComm uses it as the base of a scenario."""
    algorithm: str
    classes: dict[str, ClassFit]
    links: dict[str, Link]           # per link class: pooled fit, or the default when never seen
    link_sources: dict[str, str]     # per link class: 'fit' or 'default'
    pooled_alpha_ns: float | None
    gpus_per_node: int | None = None
    notes: list[str] = field(default_factory=list)

    def _row_params(self, r: CollRows) -> Params:
        """Fitted parameters per row: the row's class fit for its own link class, the pooled link-class
        fit for the other one (hierarchical needs both)."""
        k = len(r)
        li, le = self.links["intra_node"], self.links["inter_node"]
        prm = Params(np.full(k, li.alpha_ns), np.full(k, li.beta_ns_per_byte),
                     np.full(k, le.alpha_ns), np.full(k, le.beta_ns_per_byte))
        keys = class_keys_of(r)
        for i, key in enumerate(keys):
            fit = self.classes.get(key)
            if fit is None:
                continue
            if fit.link_class == "inter_node":
                prm.alpha_e[i], prm.beta_e[i] = fit.alpha_ns, fit.beta_ns_per_byte
            else:
                prm.alpha_i[i], prm.beta_i[i] = fit.alpha_ns, fit.beta_ns_per_byte
        return prm

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        return WhatIfComm(self, mode="absolute").transfer_ns(colls, rng)

    def with_links(self, links: dict) -> "WhatIfComm":
        return WhatIfComm(self, mode="absolute", links=links)

    def summary(self) -> pd.DataFrame:
        """One row per class: key, link class, alpha_us, bandwidth_gbps, rows, alpha source, rel_rms."""
        return pd.DataFrame([{"class": f.key, "link_class": f.link_class, "alpha_us": f.alpha_ns / 1e3,
                              "bandwidth_gbps": f.bandwidth_gbps, "rows": f.n_rows,
                              "alpha_source": f.alpha_source, "rel_rms": f.rel_rms}
                             for f in self.classes.values()])


# ---------------------------------------------------------------------------------------------------
# What-if


@dataclass
class WhatIfComm:
    """A calibrated model under changed network parameters.

    bandwidth_scale k: every link k times faster (beta / k); latency_scale s: alpha * s. links: absolute
    parameters for a link class (replace the fitted ones; the scales do not apply to a link given here).
    algorithm: ring | tree | hierarchical | auto (None: the calibration's).

    mode 'ratio' (default): measured_transfer x (A_new + B_new n) / (A_fit + B_fit n), so the unchanged
    scenario returns the measured transfers bit-identically. mode 'absolute': A_new + B_new n.
    Rows without a byte count: the alpha part is min(measured, A_fit) (fitted or pooled alpha) and the
    rest of the measured time is the bandwidth part, i.e. implied bytes n' = (measured - alpha part) /
    B_fit; both modes then use n' (ratio: alpha part x A_new / A_fit + rest x B_new / B_fit). Ops not
    modelled keep their measured transfer.
    """
    base: CalibratedModel
    bandwidth_scale: float = 1.0
    latency_scale: float = 1.0
    links: dict[str, Link | LinkOverride] | None = None
    algorithm: str | None = None
    mode: str = "ratio"

    def __post_init__(self):
        for name in ("bandwidth_scale", "latency_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        self.links = dict(self.links or {})
        check_links(self.links)
        if self.algorithm is not None and self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
        if self.mode not in ("ratio", "absolute"):
            raise ValueError(f"mode {self.mode!r}; allowed: ratio, absolute")

    @property
    def notes(self) -> list[str]:
        return self.base.notes

    def with_links(self, links: dict) -> "WhatIfComm":
        """The same what-if with some link classes replaced (the optical model puts circuits in
        inter_node's place); a LinkOverride merges field by field with one already given."""
        merged = dict(self.links or {})
        for c, ln in links.items():
            prev = merged.get(c)
            if isinstance(ln, LinkOverride) and prev is not None:  # a Link given before has no bandwidth_scale
                ln = LinkOverride(*(getattr(prev, k, None) if getattr(ln, k) is None else getattr(ln, k)
                                    for k in ("bandwidth_gbps", "latency_us", "bandwidth_scale")))
            merged[c] = ln
        return replace(self, links=merged)

    def _new_params(self, old: Params) -> Params:
        bw, lat = float(self.bandwidth_scale), float(self.latency_scale)
        # x * 1.0 and x / 1.0 are exact: with no change the new parameters are the fitted floats
        new = Params(old.alpha_i * lat, old.beta_i / bw, old.alpha_e * lat, old.beta_e / bw)
        k = len(old.alpha_i)
        for cls, a_attr, b_attr in (("intra_node", "alpha_i", "beta_i"), ("inter_node", "alpha_e", "beta_e")):
            ln = self.links.get(cls)
            if ln is None:
                continue
            if ln.latency_us is not None:
                setattr(new, a_attr, np.full(k, ln.latency_us * 1e3))
            if getattr(ln, "bandwidth_scale", None) is not None:
                setattr(new, b_attr, getattr(new, b_attr) / ln.bandwidth_scale)
            if ln.bandwidth_gbps is not None:
                setattr(new, b_attr, np.full(k, 1.0 / ln.bandwidth_gbps))
        return new

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        r = coll_rows(colls)
        if len(r) == 0:
            return np.zeros(0, dtype=np.int64)
        gpn = self.base.gpus_per_node
        old = self.base._row_params(r)
        A0, B0, modelled = cost_terms(r, self.base.algorithm, old, gpn)
        m = r.measured.astype(float)
        known = ~np.isnan(r.n)
        alpha_part = np.where(known, A0, np.minimum(m, A0))
        with np.errstate(divide="ignore", invalid="ignore"):
            n_implied = np.where(B0 > 0, (m - alpha_part) / B0, 0.0)
        n_eff = np.where(known, r.n, n_implied)
        new = self._new_params(old)
        A1, B1, _ = cost_terms(r, self.algorithm or self.base.algorithm, new, gpn, n_eff)
        if self.mode == "absolute":
            out = A1 + B1 * n_eff
            return np.where(modelled, to_ns(out), r.measured)
        with np.errstate(divide="ignore", invalid="ignore"):
            cost0 = A0 + B0 * n_eff
            ratio_known = np.where(cost0 > 0, (A1 + B1 * n_eff) / cost0, 1.0)
            a_ratio = np.where(A0 > 0, A1 / A0, 1.0)
            b_ratio = np.where(B0 > 0, B1 / B0, 1.0)
        out = np.where(known, m * ratio_known, alpha_part * a_ratio + (m - alpha_part) * b_ratio)
        return np.where(modelled, to_ns(out), r.measured)
