"""Gate configuration: thresholds and test settings from `[tool.tracekit.gate]` in a pyproject.toml,
or from a standalone TOML file (its top level, or its own [tool.tracekit.gate] table).

A threshold is relative ("5%": of the baseline median) or absolute (a number in the metric's unit,
e.g. `idle_pct = 2.0` is two percentage points). Keys are metric families (`busbw_gbps`) or single
metrics (`"busbw_gbps:all_reduce"`); the single metric wins.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from ..errors import TracekitError

# family -> (unit, better: "lower" | "higher", per_step, default threshold)
FAMILIES: dict[str, tuple[str, str, bool, str | float]] = {
    "step_time_ns": ("ns", "lower", True, "5%"),
    "exposed_comm_ns": ("ns", "lower", True, "10%"),
    "compute_ns": ("ns", "lower", True, "10%"),
    "idle_pct": ("%", "lower", True, 5.0),
    "busbw_gbps": ("GB/s", "higher", True, "10%"),
    "kernel_time_ns": ("ns", "lower", True, "10%"),
    "peak_memory_bytes": ("bytes", "lower", False, "5%"),
}

SETTINGS = {
    "alpha": "significance level of the Mann-Whitney test, 0 < alpha < 1 (default 0.05)",
    "top_kernels": "how many of the baseline's kernels (by total time) get a kernel_time_ns metric (default 5)",
    "busbw_min_bytes": "collectives smaller than this are left out of busbw_gbps: latency, not bandwidth (default 1048576)",
    "metrics": f"metric families to check (default all: {', '.join(FAMILIES)})",
    "thresholds": "table: family or family:name -> \"N%\" (relative) or a number (absolute, in the metric's unit)",
}


@dataclass(frozen=True)
class Threshold:
    value: float
    relative: bool  # value is a fraction of the baseline median

    def limit(self, baseline_median: float) -> float:
        return self.value * abs(baseline_median) if self.relative else self.value

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


@dataclass
class GateConfig:
    alpha: float = 0.05
    top_kernels: int = 5
    busbw_min_bytes: int = 1 << 20
    metrics: tuple[str, ...] = tuple(FAMILIES)
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    source: str = "defaults"

    def threshold(self, metric: str) -> Threshold:
        if metric in self.thresholds:
            return self.thresholds[metric]
        family = metric.split(":", 1)[0]
        if family in self.thresholds:
            return self.thresholds[family]
        return parse_threshold(FAMILIES[family][3], "defaults", family)


def parse_threshold(v, where: str, key: str) -> Threshold:
    how = ('use a relative threshold like "5%" or an absolute number (>= 0) in the metric\'s unit')
    if isinstance(v, bool):
        raise TracekitError(f"{where}: thresholds.{key} = {v!r}: {how}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise TracekitError(f"{where}: thresholds.{key} = {v!r}: {how}")
        return Threshold(float(v), relative=False)
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            pct = float(v.strip()[:-1])
        except ValueError:
            pct = -1.0
        if pct >= 0:
            return Threshold(pct / 100.0, relative=True)
    raise TracekitError(f"{where}: thresholds.{key} = {v!r}: {how}")


def load_config(path: str | None = None, cwd: str | None = None) -> GateConfig:
    """Read --config PATH (a pyproject.toml or a standalone TOML file), or ./pyproject.toml when it
    has a [tool.tracekit.gate] table, or fall back to the defaults."""
    if path is None:
        candidate = os.path.join(cwd or os.getcwd(), "pyproject.toml")
        if not os.path.isfile(candidate):
            return GateConfig()
        doc = _read(candidate)
        table = doc.get("tool", {}).get("tracekit", {}).get("gate")
        if table is None:
            return GateConfig()
        return _from_table(table, f"{candidate} [tool.tracekit.gate]")
    if not os.path.isfile(path):
        raise TracekitError(f"{path}: config file not found (--config takes a pyproject.toml or a TOML file)")
    doc = _read(path)
    table = doc.get("tool", {}).get("tracekit", {}).get("gate")
    if table is not None:
        return _from_table(table, f"{path} [tool.tracekit.gate]")
    if os.path.basename(path) == "pyproject.toml":
        raise TracekitError(f"{path}: no [tool.tracekit.gate] table; add one or pass a standalone TOML file")
    return _from_table(doc, path)


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise TracekitError(f"{path}: not valid TOML ({e})") from None
    except OSError as e:
        raise TracekitError(f"{path}: cannot read ({e.strerror})") from None


def _from_table(table: dict, where: str) -> GateConfig:
    if not isinstance(table, dict):
        raise TracekitError(f"{where}: expected a table of settings")
    unknown = sorted(set(table) - set(SETTINGS))
    if unknown:
        raise TracekitError(f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(SETTINGS)}")
    cfg = GateConfig(source=where)
    if "alpha" in table:
        a = table["alpha"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < 1:
            raise TracekitError(f"{where}: alpha = {a!r}: {SETTINGS['alpha']}")
        cfg.alpha = float(a)
    for key in ("top_kernels", "busbw_min_bytes"):
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TracekitError(f"{where}: {key} = {v!r}: a whole number >= 0; {SETTINGS[key]}")
            setattr(cfg, key, v)
    if "metrics" in table:
        m = table["metrics"]
        bad = [x for x in m if x not in FAMILIES] if isinstance(m, list) else [m]
        if bad:
            raise TracekitError(f"{where}: metrics has {bad[0]!r}; allowed values: {', '.join(FAMILIES)}")
        cfg.metrics = tuple(m)
    th = table.get("thresholds", {})
    if not isinstance(th, dict):
        raise TracekitError(f"{where}: thresholds must be a table ([tool.tracekit.gate.thresholds])")
    for key, v in th.items():
        if key.split(":", 1)[0] not in FAMILIES:
            raise TracekitError(f"{where}: thresholds.{key}: unknown metric; allowed: {', '.join(FAMILIES)} "
                                "(or family:name, e.g. busbw_gbps:all_reduce)")
        cfg.thresholds[key] = parse_threshold(v, where, key)
    return cfg
