"""Alpha-beta costs of collectives: the link parameters, the collectives frame the models read, and each
algorithm's cost coefficients. The models that use them are in replay/network.py, the fits in
replay/calibration.py.

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
from dataclasses import dataclass

import numpy as np
import pandas as pd

LINK_CLASSES = ("intra_node", "inter_node", "optical")
ALGORITHMS = ("ring", "tree", "hierarchical", "auto")
FLAT_ALGORITHMS = ("ring", "tree")  # the ones a calibration can fit (one link class per collective)

COLL_COLUMNS = ("coll_id", "op", "bytes", "group_size", "ranks", "n_hosts", "pg_name", "timeline",
                "measured_transfer_ns", "first_arrival_ns", "order")

REDUCE_OPS = ("all_reduce",)
SHARD_OPS = ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter")
ROOTED_OPS = ("broadcast", "reduce")
P2P_OPS = ("send", "recv", "send_recv")
SYNC_OPS = ("barrier",)
MODELLED_OPS = REDUCE_OPS + SHARD_OPS + ROOTED_OPS + P2P_OPS + SYNC_OPS


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


def check_links(links: dict):
    for k, v in links.items():
        if k not in LINK_CLASSES:
            raise ValueError(f"link class {k!r}; allowed: {', '.join(LINK_CLASSES)}")
        if not isinstance(v, (Link, LinkOverride)):
            raise TypeError(f"links[{k!r}] must be a Link or a LinkOverride")



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
class CollRows:
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


def coll_rows(colls: pd.DataFrame) -> CollRows:
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
    return CollRows(op=ops, p=floats("group_size"), hosts=floats("n_hosts"), n=floats("bytes"),
                    measured=measured, pg=objects("pg_name"), timeline=objects("timeline", "gpu"), order=order)


def is_inter(r: CollRows, gpus_per_node: int | None) -> np.ndarray:
    """Link class of a flat algorithm: inter_node when the group spans hosts (n_hosts > 1); when n_hosts
    is unknown, when the group is larger than a node (gpus_per_node given), else intra_node."""
    known = ~np.isnan(r.hosts)
    inter = known & (r.hosts > 1)
    if gpus_per_node:
        inter |= ~known & (r.p > gpus_per_node)
    return inter


def flat_coefficients(op: np.ndarray, p: np.ndarray, algorithm: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, f) with cost = a * alpha + f * n * beta for a flat ring or tree algorithm; NaN for ops not
    modelled; 0 for p <= 1."""
    k = len(op)
    a = np.full(k, np.nan)
    f = np.full(k, np.nan)
    pm1 = np.maximum(p - 1.0, 0.0)
    log2p = np.log2(np.maximum(p, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(p > 0, pm1 / p, 0.0)
    is_ar = np.isin(op, REDUCE_OPS)
    is_sh = np.isin(op, SHARD_OPS)
    is_ro = np.isin(op, ROOTED_OPS)
    is_pp = np.isin(op, P2P_OPS)
    is_sy = np.isin(op, SYNC_OPS)
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
class Coef:
    """cost = a_i alpha_i + f_i n beta_i + a_e alpha_e + f_e n beta_e (i: intra-node, e: inter-node)."""
    a_i: np.ndarray
    f_i: np.ndarray
    a_e: np.ndarray
    f_e: np.ndarray
    modelled: np.ndarray

    def terms(self, prm: "Params") -> tuple[np.ndarray, np.ndarray]:
        """(A ns, B ns/byte) under parameters prm."""
        A = self.a_i * prm.alpha_i + self.a_e * prm.alpha_e
        B = self.f_i * prm.beta_i + self.f_e * prm.beta_e
        return np.where(self.modelled, A, 0.0), np.where(self.modelled, B, 0.0)


def coefficients(r: CollRows, algorithm: str, gpus_per_node: int | None) -> Coef:
    if algorithm not in ("ring", "tree", "hierarchical"):
        raise ValueError(f"algorithm {algorithm!r}; allowed: ring, tree, hierarchical, auto")
    flat = "tree" if algorithm == "tree" else "ring"
    a, f = flat_coefficients(r.op, r.p, flat)
    modelled = ~np.isnan(a)
    a, f = np.nan_to_num(a), np.nan_to_num(f)
    inter = is_inter(r, gpus_per_node)
    zero = np.zeros(len(r))
    c = Coef(a_i=np.where(inter, 0.0, a), f_i=np.where(inter, 0.0, f),
             a_e=np.where(inter, a, 0.0), f_e=np.where(inter, f, 0.0), modelled=modelled)
    if algorithm != "hierarchical":
        return c
    # Two levels: N nodes from n_hosts, else from gpus_per_node; g = p / N ranks per node.
    N = r.hosts.copy()
    if gpus_per_node:
        unknown = np.isnan(N)
        N[unknown] = np.ceil(r.p[unknown] / gpus_per_node)
    two_level = ~np.isnan(N) & (N > 1) & np.isin(r.op, REDUCE_OPS + ("reduce_scatter", "all_gather")) & (r.p > N)
    if not two_level.any():
        return c
    Nh = np.where(two_level, N, 2.0)
    g = np.where(two_level, r.p / Nh, 2.0)
    is_ar = np.isin(r.op, REDUCE_OPS)
    mult = np.where(is_ar, 2.0, 1.0)  # all_reduce = RS + AG at each level
    a_i = mult * (g - 1.0)
    f_i = mult * (g - 1.0) / g
    a_e = mult * (Nh - 1.0)
    f_e = mult * (Nh - 1.0) / (Nh * g)
    return Coef(a_i=np.where(two_level, a_i, c.a_i), f_i=np.where(two_level, f_i, c.f_i),
                a_e=np.where(two_level, a_e, zero + c.a_e), f_e=np.where(two_level, f_e, c.f_e),
                modelled=modelled)


@dataclass
class Params:
    alpha_i: np.ndarray
    beta_i: np.ndarray
    alpha_e: np.ndarray
    beta_e: np.ndarray


def cost_terms(r: CollRows, algorithm: str, prm: Params, gpus_per_node: int | None,
               n_eff: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, modelled) of each row under algorithm; 'auto' picks, per row, the cheapest of ring, tree
    and hierarchical at the row's byte count (n_eff: bytes, or implied bytes where unknown)."""
    if algorithm != "auto":
        c = coefficients(r, algorithm, gpus_per_node)
        A, B = c.terms(prm)
        return A, B, c.modelled
    n = np.nan_to_num(r.n if n_eff is None else n_eff)
    best = None
    for alg in ("ring", "tree", "hierarchical"):
        c = coefficients(r, alg, gpus_per_node)
        A, B = c.terms(prm)
        if best is None:
            best = [A, B, c.modelled]
            continue
        better = A + B * n < best[0] + best[1] * n
        best[0] = np.where(better, A, best[0])
        best[1] = np.where(better, B, best[1])
    return best[0], best[1], best[2]


def to_ns(x: np.ndarray) -> np.ndarray:
    return np.rint(np.maximum(x, 0.0)).astype(np.int64)
