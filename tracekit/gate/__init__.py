"""The regression gate: compare a candidate run against a baseline (or a measured run against a
prediction) metric by metric, and decide pass or regression.

A metric fails only when its change in the bad direction is over its threshold AND the
Mann-Whitney test on the per-step samples says the change is significant (p < alpha). Single
values (peak memory) and samples too small for the test to ever reach alpha are decided by the
threshold alone, and the result says so.

    from tracekit.gate import compare, load_config
    result = compare(tracekit.open("base/"), tracekit.open("cand/"), load_config())
    result.passed, result.table()
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .config import FAMILIES, GateConfig, Threshold, load_config
from .metrics import step_samples, top_kernel_names
from .stats import mann_whitney, smallest_p_value


@dataclass
class MetricResult:
    metric: str
    unit: str
    better: str              # lower | higher
    status: str              # pass | fail | inconclusive (over threshold, too few samples to test) | missing
    baseline_median: float | None
    candidate_median: float | None
    change_pct: float | None  # (candidate - baseline) / |baseline|, in %
    threshold: str
    n_baseline: int
    n_candidate: int
    p_value: float | None    # None: not tested (single value or too few samples)
    effect_size: float | None  # rank-biserial correlation, candidate vs baseline
    note: str


@dataclass
class GateResult:
    metrics: list[MetricResult]
    mode: str   # regression | prediction
    alpha: float
    config_source: str

    @property
    def passed(self) -> bool:
        return not any(m.status == "fail" for m in self.metrics)

    @property
    def failed(self) -> list[MetricResult]:
        return [m for m in self.metrics if m.status == "fail"]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(m) for m in self.metrics], columns=list(MetricResult.__dataclass_fields__))

    def to_dict(self) -> dict:
        return {"passed": self.passed, "mode": self.mode, "alpha": self.alpha,
                "config": self.config_source, "metrics": [asdict(m) for m in self.metrics]}


def compare(baseline, candidate, cfg: GateConfig | None = None, *, prediction: bool = False) -> GateResult:
    """Compare two Runs. prediction=True: candidate is a model's prediction of baseline (a measured
    run); an error in either direction counts against the threshold (the model's error budget)."""
    cfg = cfg or GateConfig()
    kernels = top_kernel_names(baseline, cfg.top_kernels) if "kernel_time_ns" in cfg.metrics else []
    out: list[MetricResult] = []
    for family in cfg.metrics:
        b = step_samples(baseline, family, cfg, kernels)
        c = step_samples(candidate, family, cfg, kernels)
        for name in sorted(set(b) | set(c)):
            out.append(_judge(name, b.get(name), c.get(name), cfg, prediction))
    return GateResult(out, "prediction" if prediction else "regression", cfg.alpha, cfg.source)


def _judge(name: str, b, c, cfg: GateConfig, prediction: bool) -> MetricResult:
    family = name.split(":", 1)[0]
    unit, better, per_step, _ = FAMILIES[family]
    th: Threshold = cfg.threshold(name)
    b = np.asarray(b if b is not None else [], dtype=float)
    c = np.asarray(c if c is not None else [], dtype=float)
    base = dict(metric=name, unit=unit, better=better, threshold=str(th), n_baseline=len(b), n_candidate=len(c))
    if len(b) == 0 or len(c) == 0:
        which = "baseline" if len(b) == 0 else "candidate"
        return MetricResult(**base, status="missing", baseline_median=_med(b), candidate_median=_med(c),
                            change_pct=None, p_value=None, effect_size=None,
                            note=f"not in the {which}: not compared")
    bm, cm = float(np.median(b)), float(np.median(c))
    change = cm - bm
    change_pct = change / abs(bm) * 100.0 if bm != 0 else None
    if prediction:
        bad = abs(change)
    else:
        bad = change if better == "lower" else -change
    limit = th.limit(bm)
    over = bad > limit
    p = effect = None
    if not per_step:
        tested, note = False, "single value: threshold only"
    elif smallest_p_value(len(b), len(c)) >= cfg.alpha:
        # the test could never be significant here; failing on the threshold alone would cry wolf
        # on every noisy metric with few samples (3 allreduces per run), so it cannot fail the gate
        status = "inconclusive" if over else "pass"
        return MetricResult(**base, status=status, baseline_median=bm, candidate_median=cm, change_pct=change_pct,
                            p_value=None, effect_size=None,
                            note=f"{len(b)} vs {len(c)} samples cannot reach p < {cfg.alpha:g}: not tested")
    else:
        mw = mann_whitney(b, c)
        p, effect, tested = mw.p_value, mw.rank_biserial, True
        note = ""
    significant = tested and p < cfg.alpha
    failed = over and (significant or not tested)
    if tested:
        if failed:
            note = "over threshold and significant"
        elif over:
            note = f"over threshold but not significant (p={p:.3g})"
        elif significant and bad > 0:
            note = "significant but under threshold"
        elif significant:
            note = "significant improvement" if not prediction else "significant, within budget"
        else:
            note = "within noise"
    return MetricResult(**base, status="fail" if failed else "pass", baseline_median=bm, candidate_median=cm,
                        change_pct=change_pct, p_value=p, effect_size=effect, note=note)


def _med(a) -> float | None:
    return float(np.median(a)) if len(a) else None


__all__ = ["compare", "load_config", "GateConfig", "GateResult", "MetricResult"]
