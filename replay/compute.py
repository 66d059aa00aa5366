"""Duration model for replay's non-communication nodes: measured durations, changed by a scenario's
kernel speedups, per-rank slowdowns and a CPU speed factor.

    duration = dur_ns / speedup(node) * rank_slowdown(node.rank) / cpu_scale   (CPU-side nodes only)

- speedups: rules {kernel_class or name (regex, re.search), factor}; the first rule that matches a GPU
  node applies (put specific rules first). factor f divides the duration: f = 2 halves it. kernel_class
  and name both given: both must match. Only GPU ops (kind 'gpu') are sped up.
- rank_slowdown {rank: factor}: multiplies every compute duration of that rank: GPU ops and CPU-side
  nodes (kinds 'cpu', 'runtime'); a straggler is factor > 1.
- cpu_scale: CPU speed factor like network.bandwidth_scale: 2.0 = a host twice as fast, so 'cpu' and
  'runtime' nodes take half the time.

Never changed: 'comm' and 'barrier' nodes and communication kernels (the comm model owns their
transfer; their measured time is mostly waiting), 'sync' nodes (their measured time is waiting on the
GPU, which the engine recomputes). A node no factor touches keeps dur_ns bit for bit; the others are
rounded half to even (numpy.rint). rng is accepted for the model interface and not used.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

KERNEL_CLASSES = ("compute", "communication", "memory", "other")
NODE_KINDS = ("cpu", "runtime", "sync", "gpu", "comm", "barrier")
CPU_KINDS = ("cpu", "runtime")


def _factor(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a number > 0, got {v!r}")
    return float(v)


def _objects(df: pd.DataFrame, col: str) -> np.ndarray:
    """A column as an object array with None for every kind of missing value (None, NaN, pd.NA)."""
    if col not in df.columns:
        return np.full(len(df), None, dtype=object)
    v = df[col].astype(object).to_numpy(dtype=object, copy=True)
    v[pd.isna(df[col]).to_numpy()] = None
    return v


@dataclass(frozen=True)
class Speedup:
    factor: float
    kernel_class: str | None = None
    name: str | None = None  # regular expression, searched in the node's name

    def __post_init__(self):
        _factor(self.factor, "speedup factor")
        if self.kernel_class is None and self.name is None:
            raise ValueError("a speedup needs kernel_class or name")
        if self.kernel_class is not None and self.kernel_class not in KERNEL_CLASSES:
            raise ValueError(f"kernel_class {self.kernel_class!r}; allowed: {', '.join(KERNEL_CLASSES)}")
        if self.name is not None:
            re.compile(self.name)  # re.error names the problem

    @classmethod
    def from_dict(cls, d: dict) -> "Speedup":
        unknown = set(d) - {"factor", "kernel_class", "name", "name_regex"}
        if unknown:
            raise ValueError(f"unknown speedup key(s) {', '.join(sorted(unknown))}; allowed: kernel_class, name, factor")
        return cls(factor=d["factor"], kernel_class=d.get("kernel_class"), name=d.get("name", d.get("name_regex")))


@dataclass
class ComputeModel:
    speedups: list = field(default_factory=list)           # Speedup or dicts {kernel_class|name, factor}
    rank_slowdown: dict = field(default_factory=dict)      # {rank: factor}
    cpu_scale: float = 1.0

    def __post_init__(self):
        self.speedups = [s if isinstance(s, Speedup) else Speedup.from_dict(s) for s in self.speedups]
        self.rank_slowdown = {int(r): _factor(f, f"rank_slowdown[{r}]") for r, f in (self.rank_slowdown or {}).items()}
        self.cpu_scale = _factor(self.cpu_scale, "cpu_scale")

    @classmethod
    def identity(cls) -> "ComputeModel":
        return cls()

    def factors(self, nodes: pd.DataFrame) -> np.ndarray:
        """Multiplier of each node's measured duration (1.0 where unchanged)."""
        k = len(nodes)
        kind = _objects(nodes, "kind")
        kclass = _objects(nodes, "kernel_class")
        names = _objects(nodes, "name")
        is_gpu = (kind == "gpu") & (kclass != "communication")
        is_cpu = np.isin(kind, CPU_KINDS)
        mult = np.ones(k)
        if self.speedups:
            todo = is_gpu.copy()
            for sp in self.speedups:
                hit = todo.copy()
                if sp.kernel_class is not None:
                    hit &= kclass == sp.kernel_class
                if sp.name is not None:
                    rx = re.compile(sp.name)
                    idx = np.flatnonzero(hit)
                    ok = np.array([bool(rx.search(str(names[i]))) if names[i] is not None else False for i in idx],
                                  dtype=bool)
                    hit[:] = False
                    hit[idx[ok]] = True
                mult[hit] /= sp.factor
                todo &= ~hit
        if self.rank_slowdown:
            ranks = nodes["rank"].to_numpy(dtype="int64", na_value=-1)
            for r, f in self.rank_slowdown.items():
                mult[(ranks == r) & (is_gpu | is_cpu)] *= f
        if self.cpu_scale != 1.0:
            mult[is_cpu] /= self.cpu_scale
        return mult

    def node_durations(self, nodes: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        dur = nodes["dur_ns"].to_numpy(dtype="int64", na_value=0).copy()
        mult = self.factors(nodes)
        touched = mult != 1.0
        if touched.any():
            dur[touched] = np.rint(dur[touched].astype(np.float64) * mult[touched]).astype(np.int64)
        return dur
