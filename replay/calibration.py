"""Calibrations of the alpha-beta model: alpha and beta per process-group class, fitted from the run's own
collectives (calibrate) or from an nccl-tests curve (calibrate_nccl_tests), and the robust fitting they (and the
links model's fit, replay/linkfit.py) share: a non-negative two-parameter least squares weighted by 1 / measured,
a Theil-Sen start that finds the rows far off it, and the test whether alpha and beta can be told apart.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .costs import DEFAULT_LINKS, FLAT_ALGORITHMS, LINK_CLASSES, Link, coefficients, coll_rows, is_inter
from .network import CalibratedModel, ClassFit, class_keys_of


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


def weighted_fit(A: np.ndarray, Bn: np.ndarray, y: np.ndarray) -> tuple[float, float]:
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


def inliers(A: np.ndarray, Bn: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows within 5 robust sigmas (1.4826 x median) or 50% of a robust fit, in relative residual
    |pred - y| / max(pred, y). The 1/measured weights of the fit let a single collective measured far
    below the model (a clock glitch, a transfer hidden under another rank's late kernel) pull the whole
    class; judged against a robust fit, such rows show and are left out."""
    alpha, beta = _theil_sen(A, Bn, y)
    pred = A * alpha + Bn * beta
    rel = np.abs(pred - y) / np.maximum(np.maximum(y, pred), 1.0)
    sigma = 1.4826 * float(np.median(rel))
    return rel <= max(5.0 * sigma, 0.5)


def separable(a: np.ndarray, b: np.ndarray) -> bool:
    """alpha and beta can be told apart only when the rows' coefficient pairs are not all proportional
    (with one op, when there is more than one distinct size)."""
    if len(a) < 2:
        return False
    ang = np.arctan2(b, a)
    return float(ang.max() - ang.min()) > 1e-9


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
    r = coll_rows(colls)
    notes: list[str] = []
    keys = class_keys_of(r)
    c = coefficients(r, algorithm, gpus_per_node)
    inter = is_inter(r, gpus_per_node)
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
        if separable(A, Bn):
            keep = inliers(A, Bn, y)
            if not keep.all() and separable(A[keep], Bn[keep]):
                notes.append(f"class {key}: {int((~keep).sum())} of {len(y)} collective(s) far off a robust fit "
                             "(relative residual > 5 robust sigmas and > 50%) left out")
                A, Bn, y = A[keep], Bn[keep], y[keep]
            alpha, beta = weighted_fit(A, Bn, y)
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
