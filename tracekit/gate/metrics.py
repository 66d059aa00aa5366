"""Metrics of one run for the gate: name -> samples (one per rank and step where the metric is per
step, one value otherwise), read from the store's views and the analyses."""
from __future__ import annotations

import numpy as np

from .config import GateConfig


def step_samples(run, family: str, cfg: GateConfig, kernel_names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Samples of one metric family, keyed by full metric name. Empty dict: the run does not have it
    (no steps, no collectives of that size, no [memory] events ...)."""
    return _EXTRACTORS[family](run, cfg, kernel_names)


def _arr(series) -> np.ndarray:
    return np.asarray(series.dropna(), dtype=float)


def _step_time(run, cfg, _):
    df = run.sql("SELECT dur_ns FROM steps WHERE dur_ns IS NOT NULL")
    return {"step_time_ns": _arr(df["dur_ns"])} if len(df) else {}


def _exposed_comm(run, cfg, _):
    df = run.analyze("exposed_comm")
    df = df[df["step"].notna()]
    return {"exposed_comm_ns": _arr(df["exposed_comm_ns"])} if len(df) else {}


def _temporal(column):
    def extract(run, cfg, _):
        df = run.analyze("temporal_breakdown", by_step=True)
        df = df[df["step"].notna()]
        return {column: _arr(df[column])} if len(df) else {}
    return extract


def _busbw(run, cfg, _):
    df = run.analyze("collectives_matched")
    # small messages measure latency: their "bandwidth" swings by orders of magnitude with scheduling
    df = df[(df["bytes"] >= cfg.busbw_min_bytes) & df["busbw_gbps"].notna()]
    return {f"busbw_gbps:{op}": _arr(g["busbw_gbps"]) for op, g in df.groupby("op", sort=True)}


def top_kernel_names(run, n: int) -> list[str]:
    if n <= 0:
        return []
    df = run.sql("SELECT name FROM kernels WHERE step IS NOT NULL GROUP BY name "
                 "ORDER BY sum(dur_ns) DESC, name LIMIT ?", [n])
    return df["name"].tolist()


def _kernel_time(run, cfg, names):
    out = {}
    for name in names or []:
        # every (rank, step) of the run counts, with 0 where the kernel did not run: a kernel that
        # vanished from the candidate is an improvement, not a missing metric
        df = run.sql("""
            SELECT coalesce(k.total_ns, 0) AS kernel_ns
            FROM steps s
            LEFT JOIN (SELECT rank, step, sum(dur_ns) AS total_ns FROM kernels WHERE name = ?
                       GROUP BY rank, step) k ON s.rank = k.rank AND s.step = k.step""", [name])
        if len(df):
            out[f"kernel_time_ns:{name}"] = _arr(df["kernel_ns"])
    return out


def _peak_memory(run, cfg, _):
    df = run.analyze("memory_peak")
    vals = df["peak_allocated_bytes"].dropna() if len(df) else df
    return {"peak_memory_bytes": np.array([float(vals.max())])} if len(vals) else {}


_EXTRACTORS = {
    "step_time_ns": _step_time,
    "exposed_comm_ns": _exposed_comm,
    "compute_ns": _temporal("compute_ns"),
    "idle_pct": _temporal("idle_pct"),
    "busbw_gbps": _busbw,
    "kernel_time_ns": _kernel_time,
    "peak_memory_bytes": _peak_memory,
}
