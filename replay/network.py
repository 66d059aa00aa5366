"""Communication model for replay: how long each collective's transfer takes, measured or predicted.

A collective's measured duration splits into waiting (for the last participant) and transfer (after
it arrived); the engine asks a CommModel for the transfer part only. Models here:

- MeasuredComm: the measured transfer, unchanged.
- AlphaBetaModel: alpha-beta costs (latency alpha, inverse bandwidth beta) per link class and
  algorithm (ring / tree / hierarchical / auto), absolute, from link parameters.
- calibrate() / calibrate_nccl_tests() -> CalibratedModel: alpha and beta fitted from the run's own
  collectives (per process-group class) or from an nccl-tests curve.
- WhatIfComm: a calibrated model under changed links / algorithm. 'ratio' mode scales each measured
  transfer by (cost under the new parameters / cost under the fitted ones), so the unchanged scenario
  returns the measured transfers exactly; 'absolute' mode returns the model's own prediction.

Every model maps a DataFrame of collective instances (one row each, columns in COLL_COLUMNS) to an
int64 array of transfer times in ns, in row order. Nothing reads the clock; rng is accepted for models
with noise and ignored by the deterministic ones here.

Cost of one collective, p ranks, n bytes (nccl-tests convention: all_gather = output buffer,
reduce_scatter = input buffer), as cost = A + B * n with A in ns and B in ns/byte:

    op                      ring                         tree (all_reduce, broadcast, reduce)
    all_reduce              2(p-1) a + 2(p-1)/p n b       2 log2(p) a + 2 n b
    reduce_scatter/gather   (p-1) a + (p-1)/p n b         (ring)
    all_to_all              (p-1) a + (p-1)/p n b         (ring)
    broadcast, reduce       (p-1) a + n b (pipelined)     log2(p) a + n b
    send, recv, send_recv   a + n b
    barrier                 2 log2(p) a

hierarchical (g ranks per node, N nodes; all_reduce, reduce_scatter, all_gather; other ops as ring):
intra-node reduce-scatter, inter-node all-reduce (or RS / AG) of n/g bytes over the NICs, intra-node
all-gather; for all_reduce 2(g-1) a_i + 2(g-1)/g n b_i + 2(N-1) a_e + 2(N-1)/N (n/g) b_e.
auto: per collective, the cheapest of ring, tree and hierarchical under the parameters in force.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pandas as pd

LINK_CLASSES = ("intra_node", "inter_node", "optical")
ALGORITHMS = ("ring", "tree", "hierarchical", "auto")
FLAT_ALGORITHMS = ("ring", "tree")  # the ones a calibration can fit (one link class per collective)

COLL_COLUMNS = ("coll_id", "op", "bytes", "group_size", "ranks", "n_hosts", "pg_name", "timeline",
                "measured_transfer_ns", "first_arrival_ns", "order")

_REDUCE_OPS = ("all_reduce",)
_SHARD_OPS = ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter")
_ROOTED_OPS = ("broadcast", "reduce")
_P2P_OPS = ("send", "recv", "send_recv")
_SYNC_OPS = ("barrier",)
MODELLED_OPS = _REDUCE_OPS + _SHARD_OPS + _ROOTED_OPS + _P2P_OPS + _SYNC_OPS


@dataclass(frozen=True)
class Link:
    """One link class: bandwidth in GB/s (1e9 bytes/s) and per-hop latency in us."""
    bandwidth_gbps: float
    latency_us: float

    def __post_init__(self):
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ValueError(f"bandwidth_gbps must be a finite number > 0, got {self.bandwidth_gbps!r}")
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ValueError(f"latency_us must be a finite number >= 0, got {self.latency_us!r}")

    @property
    def alpha_ns(self) -> float:
        return self.latency_us * 1e3

    @property
    def beta_ns_per_byte(self) -> float:
        return 1.0 / self.bandwidth_gbps  # 1 GB/s = 1 byte/ns

    @classmethod
    def from_alpha_beta(cls, alpha_ns: float, beta_ns_per_byte: float) -> "Link":
        return cls(bandwidth_gbps=1.0 / beta_ns_per_byte if beta_ns_per_byte > 0 else math.inf,
                   latency_us=alpha_ns / 1e3)


# Defaults, used only where nothing was calibrated (calibrate='none', or a link class the run never
# used). Vendor figures for an H100 system: NVLink 4 is 900 GB/s per GPU both directions together, i.e.
# 450 GB/s each way; a ConnectX-7 NDR port is 400 Gbit/s = 50 GB/s. Latencies are the order of NCCL's
# own base latencies for NVLink and InfiniBand (a few us). An optical circuit port is a NIC port with
# no switch hop: same 50 GB/s, lower latency. Calibrate from the run or nccl-tests for real numbers.
DEFAULT_LINKS: dict[str, Link] = {
    "intra_node": Link(bandwidth_gbps=450.0, latency_us=3.0),
    "inter_node": Link(bandwidth_gbps=50.0, latency_us=8.0),
    "optical": Link(bandwidth_gbps=50.0, latency_us=2.0),
}


@dataclass(frozen=True)
class LinkOverride:
    """New parameters for a link class in a what-if; a field left None keeps the fitted (scaled) value.
    bandwidth_scale: that class's fitted bandwidth times this (the hosts' NICs k x faster and the fabric inside
    the hosts as it was, where [network] bandwidth_scale speeds up every link); bandwidth_gbps, if given, wins."""
    bandwidth_gbps: float | None = None
    latency_us: float | None = None
    bandwidth_scale: float | None = None

    def __post_init__(self):
        if self.bandwidth_gbps is not None and not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ValueError(f"bandwidth_gbps must be a finite number > 0, got {self.bandwidth_gbps!r}")
        if self.bandwidth_scale is not None and not (math.isfinite(self.bandwidth_scale) and self.bandwidth_scale > 0):
            raise ValueError(f"bandwidth_scale must be a finite number > 0, got {self.bandwidth_scale!r}")
        if self.latency_us is not None and not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ValueError(f"latency_us must be a finite number >= 0, got {self.latency_us!r}")

    def over(self, link: Link) -> Link:
        bw = link.bandwidth_gbps * (self.bandwidth_scale or 1.0)
        return Link(bandwidth_gbps=bw if self.bandwidth_gbps is None else self.bandwidth_gbps,
                    latency_us=link.latency_us if self.latency_us is None else self.latency_us)


class CommModel(Protocol):
    notes: list[str]  # what the model assumed that a reader of the replay should know

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        """Transfer time (ns, int64) per row of colls, in row order."""
        ...


# ---------------------------------------------------------------------------------------------------
# Column access and the cost coefficients


def colls_frame(rows, *, arrival_step_ns: int = 1000, timeline: str = "gpu") -> pd.DataFrame:
    """A collectives frame with the engine's columns and dtypes (the CommModel contract) from rows (a
    DataFrame or records) giving op, bytes, group_size, n_hosts, measured_transfer_ns and optionally
    pg_name: coll_id and order follow the rows, ranks are 0..group_size-1, arrivals arrival_step_ns apart."""
    df = pd.DataFrame(rows).copy()
    n = len(df)
    if "pg_name" not in df:
        df["pg_name"] = None
    df.insert(0, "coll_id", np.arange(n, dtype=np.int64))
    df["bytes"] = df["bytes"].astype("Int64")
    df["n_hosts"] = df["n_hosts"].astype("Int64")
    df["group_size"] = df["group_size"].astype("int64")
    df["measured_transfer_ns"] = df["measured_transfer_ns"].astype("int64")
    df["ranks"] = [list(range(p)) for p in df["group_size"]]
    df["timeline"] = timeline
    df["first_arrival_ns"] = np.arange(n, dtype=np.int64) * arrival_step_ns
    df["order"] = np.arange(n, dtype=np.int64)
    return df


@dataclass
class _Rows:
    """The columns the models read, as numpy arrays (pandas nullable columns become NaN floats)."""
    op: np.ndarray           # object
    p: np.ndarray            # float
    hosts: np.ndarray        # float, NaN unknown
    n: np.ndarray            # float bytes, NaN unknown
    measured: np.ndarray     # int64
    pg: np.ndarray           # object (None where absent)
    timeline: np.ndarray     # object
    order: np.ndarray        # int64

    def __len__(self):
        return len(self.op)


def _rows(colls: pd.DataFrame) -> _Rows:
    missing = [c for c in ("op", "group_size", "measured_transfer_ns") if c not in colls.columns]
    if missing:
        raise ValueError(f"collectives frame lacks column(s) {', '.join(missing)}")
    k = len(colls)

    def floats(col):
        if col not in colls.columns:
            return np.full(k, np.nan)
        return pd.to_numeric(colls[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)

    def objects(col, default=None):
        if col not in colls.columns:
            return np.full(k, default, dtype=object)
        v = colls[col].astype(object).to_numpy(dtype=object, copy=True)
        v[pd.isna(colls[col]).to_numpy()] = default
        return v

    measured = colls["measured_transfer_ns"].to_numpy(dtype="int64", na_value=0)
    order = (colls["order"].to_numpy(dtype="int64", na_value=0) if "order" in colls.columns
             else np.arange(k, dtype=np.int64))
    ops = np.array([str(o).lower() if o is not None else "" for o in objects("op")], dtype=object)
    return _Rows(op=ops, p=floats("group_size"), hosts=floats("n_hosts"), n=floats("bytes"),
                 measured=measured, pg=objects("pg_name"), timeline=objects("timeline", "gpu"), order=order)


def _is_inter(r: _Rows, gpus_per_node: int | None) -> np.ndarray:
    """Link class of a flat algorithm: inter_node when the group spans hosts (n_hosts > 1); when n_hosts
    is unknown, when the group is larger than a node (gpus_per_node given), else intra_node."""
    known = ~np.isnan(r.hosts)
    inter = known & (r.hosts > 1)
    if gpus_per_node:
        inter |= ~known & (r.p > gpus_per_node)
    return inter


def _flat_coefficients(op: np.ndarray, p: np.ndarray, algorithm: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, f) with cost = a * alpha + f * n * beta for a flat ring or tree algorithm; NaN for ops not
    modelled; 0 for p <= 1."""
    k = len(op)
    a = np.full(k, np.nan)
    f = np.full(k, np.nan)
    pm1 = np.maximum(p - 1.0, 0.0)
    log2p = np.log2(np.maximum(p, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(p > 0, pm1 / p, 0.0)
    is_ar = np.isin(op, _REDUCE_OPS)
    is_sh = np.isin(op, _SHARD_OPS)
    is_ro = np.isin(op, _ROOTED_OPS)
    is_pp = np.isin(op, _P2P_OPS)
    is_sy = np.isin(op, _SYNC_OPS)
    if algorithm == "tree":
        a[is_ar], f[is_ar] = 2.0 * log2p[is_ar], 2.0
        a[is_ro], f[is_ro] = log2p[is_ro], 1.0
    else:
        a[is_ar], f[is_ar] = 2.0 * pm1[is_ar], 2.0 * frac[is_ar]
        a[is_ro], f[is_ro] = pm1[is_ro], 1.0
    a[is_sh], f[is_sh] = pm1[is_sh], frac[is_sh]
    a[is_pp], f[is_pp] = 1.0, 1.0
    a[is_sy], f[is_sy] = 2.0 * log2p[is_sy], 0.0
    single = p <= 1
    a[single & ~np.isnan(a)] = 0.0
    f[single & ~np.isnan(f)] = 0.0
    return a, f


@dataclass
class _Coef:
    """cost = a_i alpha_i + f_i n beta_i + a_e alpha_e + f_e n beta_e (i: intra-node, e: inter-node)."""
    a_i: np.ndarray
    f_i: np.ndarray
    a_e: np.ndarray
    f_e: np.ndarray
    modelled: np.ndarray

    def terms(self, prm: "_Params") -> tuple[np.ndarray, np.ndarray]:
        """(A ns, B ns/byte) under parameters prm."""
        A = self.a_i * prm.alpha_i + self.a_e * prm.alpha_e
        B = self.f_i * prm.beta_i + self.f_e * prm.beta_e
        return np.where(self.modelled, A, 0.0), np.where(self.modelled, B, 0.0)


def _coefficients(r: _Rows, algorithm: str, gpus_per_node: int | None) -> _Coef:
    if algorithm not in ("ring", "tree", "hierarchical"):
        raise ValueError(f"algorithm {algorithm!r}; allowed: ring, tree, hierarchical, auto")
    flat = "tree" if algorithm == "tree" else "ring"
    a, f = _flat_coefficients(r.op, r.p, flat)
    modelled = ~np.isnan(a)
    a, f = np.nan_to_num(a), np.nan_to_num(f)
    inter = _is_inter(r, gpus_per_node)
    zero = np.zeros(len(r))
    c = _Coef(a_i=np.where(inter, 0.0, a), f_i=np.where(inter, 0.0, f),
              a_e=np.where(inter, a, 0.0), f_e=np.where(inter, f, 0.0), modelled=modelled)
    if algorithm != "hierarchical":
        return c
    # Two levels: N nodes from n_hosts, else from gpus_per_node; g = p / N ranks per node.
    N = r.hosts.copy()
    if gpus_per_node:
        unknown = np.isnan(N)
        N[unknown] = np.ceil(r.p[unknown] / gpus_per_node)
    two_level = ~np.isnan(N) & (N > 1) & np.isin(r.op, _REDUCE_OPS + ("reduce_scatter", "all_gather")) & (r.p > N)
    if not two_level.any():
        return c
    Nh = np.where(two_level, N, 2.0)
    g = np.where(two_level, r.p / Nh, 2.0)
    is_ar = np.isin(r.op, _REDUCE_OPS)
    mult = np.where(is_ar, 2.0, 1.0)  # all_reduce = RS + AG at each level
    a_i = mult * (g - 1.0)
    f_i = mult * (g - 1.0) / g
    a_e = mult * (Nh - 1.0)
    f_e = mult * (Nh - 1.0) / (Nh * g)
    return _Coef(a_i=np.where(two_level, a_i, c.a_i), f_i=np.where(two_level, f_i, c.f_i),
                 a_e=np.where(two_level, a_e, zero + c.a_e), f_e=np.where(two_level, f_e, c.f_e),
                 modelled=modelled)


@dataclass
class _Params:
    alpha_i: np.ndarray
    beta_i: np.ndarray
    alpha_e: np.ndarray
    beta_e: np.ndarray


def _cost_terms(r: _Rows, algorithm: str, prm: _Params, gpus_per_node: int | None,
                n_eff: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, modelled) of each row under algorithm; 'auto' picks, per row, the cheapest of ring, tree
    and hierarchical at the row's byte count (n_eff: bytes, or implied bytes where unknown)."""
    if algorithm != "auto":
        c = _coefficients(r, algorithm, gpus_per_node)
        A, B = c.terms(prm)
        return A, B, c.modelled
    n = np.nan_to_num(r.n if n_eff is None else n_eff)
    best = None
    for alg in ("ring", "tree", "hierarchical"):
        c = _coefficients(r, alg, gpus_per_node)
        A, B = c.terms(prm)
        if best is None:
            best = [A, B, c.modelled]
            continue
        better = A + B * n < best[0] + best[1] * n
        best[0] = np.where(better, A, best[0])
        best[1] = np.where(better, B, best[1])
    return best[0], best[1], best[2]


def _to_ns(x: np.ndarray) -> np.ndarray:
    return np.rint(np.maximum(x, 0.0)).astype(np.int64)


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
        _check_links(given)
        self.links = {c: (given[c].over(DEFAULT_LINKS[c]) if isinstance(given.get(c), LinkOverride)
                          else given.get(c, DEFAULT_LINKS[c])) for c in LINK_CLASSES}
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")

    @property
    def notes(self) -> list[str]:
        return []  # nothing fitted, nothing to say

    def _params(self, k: int) -> _Params:
        i, e = self.links["intra_node"], self.links["inter_node"]
        return _Params(np.full(k, i.alpha_ns), np.full(k, i.beta_ns_per_byte),
                       np.full(k, e.alpha_ns), np.full(k, e.beta_ns_per_byte))

    def with_links(self, links: dict) -> "AlphaBetaModel":
        _check_links(links)
        merged = {c: (links[c].over(self.links[c]) if isinstance(links.get(c), LinkOverride)
                      else links.get(c, self.links[c])) for c in LINK_CLASSES}
        return replace(self, links=merged)

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        r = _rows(colls)
        A, B, modelled = _cost_terms(r, self.algorithm, self._params(len(r)), self.gpus_per_node)
        pred = _to_ns(A + B * np.nan_to_num(r.n))
        keep = ~modelled | np.isnan(r.n)
        return np.where(keep, r.measured, pred)


def _check_links(links: dict):
    for k, v in links.items():
        if k not in LINK_CLASSES:
            raise ValueError(f"link class {k!r}; allowed: {', '.join(LINK_CLASSES)}")
        if not isinstance(v, (Link, LinkOverride)):
            raise TypeError(f"links[{k!r}] must be a Link or a LinkOverride")


# ---------------------------------------------------------------------------------------------------
# Calibration


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
    r = _rows(colls)
    return _class_keys(r)


def _class_keys(r: _Rows) -> np.ndarray:
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


def _nnls2(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares with two unknowns: the unconstrained solution when it is feasible,
    else the better of the two one-variable fits (the KKT cases of a 2-variable NNLS)."""
    sol, *_ = np.linalg.lstsq(X, y, rcond=None)
    if (sol >= 0).all():
        return sol
    best, best_res = np.zeros(2), float(y @ y)
    for j in range(2):
        xj = X[:, j]
        d = float(xj @ xj)
        if d <= 0:
            continue
        v = max(0.0, float(xj @ y) / d)
        cand = np.zeros(2)
        cand[j] = v
        res = float(np.sum((y - X @ cand) ** 2))
        if res < best_res:
            best, best_res = cand, res
    return best


def _weighted_fit(A: np.ndarray, Bn: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    w = 1.0 / np.maximum(y, 1.0)
    alpha, beta = _nnls2(np.column_stack([A * w, Bn * w]), y * w)
    return float(alpha), float(beta)


def _theil_sen(A: np.ndarray, Bn: np.ndarray, y: np.ndarray, cap: int = 300) -> tuple[float, float]:
    """Robust start: y / A = alpha + (Bn / A) beta is a line; its slope is the median of pairwise
    slopes (Theil-Sen, on at most cap rows spread evenly over x), its intercept the median residual."""
    ok = A > 0
    x, z = Bn[ok] / A[ok], y[ok] / A[ok]
    order = np.argsort(x, kind="stable")
    pick = order[np.unique(np.linspace(0, len(order) - 1, min(cap, len(order))).round().astype(int))]
    xs, zs = x[pick], z[pick]
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    good = dx > 0
    beta = max(0.0, float(np.median((zs[j] - zs[i])[good] / dx[good]))) if good.any() else 0.0
    alpha = max(0.0, float(np.median(z - beta * x)))
    return alpha, beta


def _inliers(A: np.ndarray, Bn: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows within 5 robust sigmas (1.4826 x median) or 50% of a robust fit, in relative residual
    |pred - y| / max(pred, y). The 1/measured weights of the fit let a single collective measured far
    below the model (a clock glitch, a transfer hidden under another rank's late kernel) pull the whole
    class; judged against a robust fit, such rows show and are left out."""
    alpha, beta = _theil_sen(A, Bn, y)
    pred = A * alpha + Bn * beta
    rel = np.abs(pred - y) / np.maximum(np.maximum(y, pred), 1.0)
    sigma = 1.4826 * float(np.median(rel))
    return rel <= max(5.0 * sigma, 0.5)


def _separable(a: np.ndarray, b: np.ndarray) -> bool:
    """alpha and beta can be told apart only when the rows' coefficient pairs are not all proportional
    (with one op, when there is more than one distinct size)."""
    if len(a) < 2:
        return False
    ang = np.arctan2(b, a)
    return float(ang.max() - ang.min()) > 1e-9


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

    def _row_params(self, r: _Rows) -> _Params:
        """Fitted parameters per row: the row's class fit for its own link class, the pooled link-class
        fit for the other one (hierarchical needs both)."""
        k = len(r)
        li, le = self.links["intra_node"], self.links["inter_node"]
        prm = _Params(np.full(k, li.alpha_ns), np.full(k, li.beta_ns_per_byte),
                      np.full(k, le.alpha_ns), np.full(k, le.beta_ns_per_byte))
        keys = _class_keys(r)
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


def calibrate(colls: pd.DataFrame, algorithm: str = "ring", gpus_per_node: int | None = None) -> CalibratedModel:
    """Fit alpha and beta per process-group class from the run's own collectives.

    Each row with known bytes and a modelled op gives measured_transfer_ns ~ a * alpha + f * n * beta
    with (a, f) the algorithm's coefficients; the fit is non-negative least squares weighted by
    1 / measured (timing noise is proportional to the time, and an unweighted fit would let the largest
    messages decide alpha). A class whose rows cannot separate alpha from beta (one size of one op)
    takes a pooled alpha from the separable classes (same link class first) and fits beta alone; with
    no separable class anywhere, alpha = 0. Both fallbacks are written to notes.
    """
    if algorithm not in FLAT_ALGORITHMS:
        raise ValueError(f"calibration algorithm {algorithm!r}; allowed: {', '.join(FLAT_ALGORITHMS)}")
    r = _rows(colls)
    notes: list[str] = []
    keys = _class_keys(r)
    c = _coefficients(r, algorithm, gpus_per_node)
    inter = _is_inter(r, gpus_per_node)
    a = c.a_i + c.a_e
    f = c.f_i + c.f_e
    usable = c.modelled & ~np.isnan(r.n) & (r.p > 1) & (r.measured > 0)
    n_unmodelled = int((~c.modelled).sum())
    if n_unmodelled:
        ops = sorted(set(r.op[~c.modelled]))
        notes.append(f"{n_unmodelled} collective(s) of op(s) {', '.join(ops)} are not modelled: they keep their measured transfer")
    n_nobytes = int((c.modelled & np.isnan(r.n)).sum())
    if n_nobytes:
        notes.append(f"{n_nobytes} collective(s) without a byte count: not used in the fit; a what-if scales "
                     "their measured transfer minus the fitted alpha part")

    groups: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(keys[usable]):
        groups[key] = np.flatnonzero(usable & (keys == key))

    fits: dict[str, ClassFit] = {}
    pending: list[str] = []
    for key, idx in groups.items():
        A = a[idx]
        Bn = f[idx] * r.n[idx]
        y = r.measured[idx].astype(float)
        link = "inter_node" if inter[idx].any() else "intra_node"
        if _separable(A, Bn):
            keep = _inliers(A, Bn, y)
            if not keep.all() and _separable(A[keep], Bn[keep]):
                notes.append(f"class {key}: {int((~keep).sum())} of {len(y)} collective(s) far off a robust fit "
                             "(relative residual > 5 robust sigmas and > 50%) left out")
                A, Bn, y = A[keep], Bn[keep], y[keep]
            alpha, beta = _weighted_fit(A, Bn, y)
            fits[key] = _class_fit(key, link, alpha, beta, A, Bn, y, "fit")
        else:
            pending.append(key)

    def pooled(link: str | None) -> float | None:
        sel = [ft for ft in fits.values() if ft.alpha_source == "fit" and (link is None or ft.link_class == link)]
        if not sel:
            return None
        return float(np.average([ft.alpha_ns for ft in sel], weights=[ft.n_rows for ft in sel]))

    pooled_any = pooled(None)
    for key in pending:
        idx = groups[key]
        A = a[idx]
        Bn = f[idx] * r.n[idx]
        y = r.measured[idx].astype(float)
        link = "inter_node" if inter[idx].any() else "intra_node"
        alpha = pooled(link)
        source = "pooled"
        if alpha is None:
            alpha = pooled_any
        if alpha is None:
            alpha, source = 0.0, "zero"
            notes.append(f"class {key}: one message size, alpha cannot be separated from beta and no other class "
                         "gives one: alpha = 0, all of the measured time is counted as bandwidth")
        else:
            notes.append(f"class {key}: one message size, alpha cannot be separated from beta: pooled alpha "
                         f"{alpha / 1e3:.3g} us from the other classes, beta fitted alone")
        w = 1.0 / np.maximum(y, 1.0)
        rest = (y - A * alpha) * w
        xb = Bn * w
        beta = max(0.0, float(xb @ rest) / float(xb @ xb)) if float(xb @ xb) > 0 else 0.0
        fits[key] = _class_fit(key, link, alpha, beta, A, Bn, y, source)

    links: dict[str, Link] = {}
    sources: dict[str, str] = {}
    for link in LINK_CLASSES:
        sel = [ft for ft in fits.values() if ft.link_class == link and ft.beta_ns_per_byte > 0]
        if sel:
            w = [ft.n_rows for ft in sel]
            links[link] = Link.from_alpha_beta(float(np.average([ft.alpha_ns for ft in sel], weights=w)),
                                               float(np.average([ft.beta_ns_per_byte for ft in sel], weights=w)))
            sources[link] = "fit"
        else:
            links[link] = DEFAULT_LINKS[link]
            sources[link] = "default"
            if link != "optical":
                notes.append(f"no {link} collective with a byte count: {link} uses the default "
                             f"{links[link].bandwidth_gbps:g} GB/s, {links[link].latency_us:g} us")
    return CalibratedModel(algorithm=algorithm, classes=fits, links=links, link_sources=sources,
                           pooled_alpha_ns=pooled_any, gpus_per_node=gpus_per_node, notes=notes)


def _class_fit(key, link, alpha, beta, A, Bn, y, source) -> ClassFit:
    pred = A * alpha + Bn * beta
    rel = (pred - y) / np.maximum(y, 1.0)
    return ClassFit(key=key, link_class=link, alpha_ns=float(alpha), beta_ns_per_byte=float(beta),
                    n_rows=len(y), alpha_source=source, rel_rms=float(np.sqrt(np.mean(rel ** 2))))


def calibrate_nccl_tests(df: pd.DataFrame, group_size: int, n_hosts: int = 1, algorithm: str = "ring",
                         gpus_per_node: int | None = None, in_place: bool | None = None) -> CalibratedModel:
    """Fit alpha/beta from nccl-tests rows (the store's nccl_tests view: op, size_bytes, time_us, ...).

    nccl-tests records neither the number of ranks nor of hosts: group_size and n_hosts say what the
    test ran on. Its time is the whole collective with every rank already synchronised, i.e. a transfer
    time. The result's link class (intra_node when n_hosts == 1, else inter_node) is what a run's
    collectives of other process groups fall back to. in_place: keep only that half (None: both).
    """
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    d = df[df["time_us"].notna() & df["size_bytes"].notna()]
    if in_place is not None and "in_place" in d.columns:
        d = d[d["in_place"] == in_place]
    if d.empty:
        raise ValueError("no nccl-tests row with a time to calibrate from")
    colls = pd.DataFrame({
        "coll_id": np.arange(len(d), dtype=np.int64),
        "op": d["op"].astype(object).to_numpy(),
        "bytes": pd.array(d["size_bytes"].to_numpy(dtype="int64"), dtype="Int64"),
        "group_size": np.full(len(d), group_size, dtype=np.int64),
        "n_hosts": pd.array(np.full(len(d), n_hosts), dtype="Int64"),
        "pg_name": None,
        "timeline": "gpu",
        "measured_transfer_ns": np.rint(d["time_us"].to_numpy(dtype=float) * 1e3).astype(np.int64),
    })
    model = calibrate(colls, algorithm=algorithm, gpus_per_node=gpus_per_node)
    model.notes.insert(0, f"calibrated from {len(d)} nccl-tests row(s) taken as {group_size} ranks on {n_hosts} host(s)")
    return model


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
        _check_links(self.links)
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

    def _new_params(self, old: _Params) -> _Params:
        bw, lat = float(self.bandwidth_scale), float(self.latency_scale)
        # x * 1.0 and x / 1.0 are exact: with no change the new parameters are the fitted floats
        new = _Params(old.alpha_i * lat, old.beta_i / bw, old.alpha_e * lat, old.beta_e / bw)
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
        r = _rows(colls)
        if len(r) == 0:
            return np.zeros(0, dtype=np.int64)
        gpn = self.base.gpus_per_node
        old = self.base._row_params(r)
        A0, B0, modelled = _cost_terms(r, self.base.algorithm, old, gpn)
        m = r.measured.astype(float)
        known = ~np.isnan(r.n)
        alpha_part = np.where(known, A0, np.minimum(m, A0))
        with np.errstate(divide="ignore", invalid="ignore"):
            n_implied = np.where(B0 > 0, (m - alpha_part) / B0, 0.0)
        n_eff = np.where(known, r.n, n_implied)
        new = self._new_params(old)
        A1, B1, _ = _cost_terms(r, self.algorithm or self.base.algorithm, new, gpn, n_eff)
        if self.mode == "absolute":
            out = A1 + B1 * n_eff
            return np.where(modelled, _to_ns(out), r.measured)
        with np.errstate(divide="ignore", invalid="ignore"):
            cost0 = A0 + B0 * n_eff
            ratio_known = np.where(cost0 > 0, (A1 + B1 * n_eff) / cost0, 1.0)
            a_ratio = np.where(A0 > 0, A1 / A0, 1.0)
            b_ratio = np.where(B0 > 0, B1 / B0, 1.0)
        out = np.where(known, m * ratio_known, alpha_part * a_ratio + (m - alpha_part) * b_ratio)
        return np.where(modelled, _to_ns(out), r.measured)
