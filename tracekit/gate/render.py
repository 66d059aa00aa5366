"""Gate results as text for people and CI: a short table, Markdown (a CI job summary), JUnit XML
(one test case per metric) and JSON."""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

from . import GateResult, MetricResult


def _num(v, digits=4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.{digits}g}" if abs(v) < 1e6 else f"{v:.0f}"


def verdict(result: GateResult) -> str:
    if result.passed:
        return "PASS"
    return "REGRESSION" if result.mode == "regression" else "OVER ERROR BUDGET"


def summary_rows(result: GateResult) -> list[dict]:
    """The short table: one row per metric, numbers rounded for reading."""
    return [{"metric": m.metric, "status": m.status, "baseline": _num(m.baseline_median),
             "candidate": _num(m.candidate_median),
             "change": "" if m.change_pct is None else f"{m.change_pct:+.1f}%",
             "threshold": m.threshold, "p_value": _num(m.p_value, 3), "n": f"{m.n_baseline}/{m.n_candidate}",
             "note": m.note} for m in result.metrics]


def markdown(result: GateResult, baseline: str, candidate: str) -> str:
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "❔", "missing": "➖"}
    lines = [f"### tracekit gate: {verdict(result)}", "",
             f"Baseline `{baseline}`, {'prediction' if result.mode == 'prediction' else 'candidate'} "
             f"`{candidate}`; Mann-Whitney alpha {result.alpha:g}; thresholds from {result.config_source}.", "",
             "| | metric | baseline | candidate | change | threshold | p | n | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r, m in zip(summary_rows(result), result.metrics):
        lines.append(f"| {icon[m.status]} | `{r['metric']}` | {r['baseline']} | {r['candidate']} | {r['change']} "
                     f"| {r['threshold']} | {r['p_value']} | {r['n']} | {r['note']} |")
    return "\n".join(lines) + "\n"


def junit(result: GateResult) -> str:
    suite = ET.Element("testsuite", name="tracekit gate", tests=str(len(result.metrics)),
                       failures=str(len(result.failed)),
                       skipped=str(sum(m.status in ("missing", "inconclusive") for m in result.metrics)))
    for m in result.metrics:
        case = ET.SubElement(suite, "testcase", classname=f"tracekit.gate.{result.mode}", name=m.metric)
        if m.status == "fail":
            ET.SubElement(case, "failure", message=_describe(m)).text = _describe(m)
        elif m.status in ("missing", "inconclusive"):
            ET.SubElement(case, "skipped", message=_describe(m))
        else:
            ET.SubElement(case, "system-out").text = _describe(m)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _describe(m: MetricResult) -> str:
    change = "" if m.change_pct is None else f" ({m.change_pct:+.1f}%)"
    p = "" if m.p_value is None else f", p={m.p_value:.3g}"
    return (f"{m.metric}: baseline median {_num(m.baseline_median)} {m.unit}, candidate {_num(m.candidate_median)}"
            f"{change}, threshold {m.threshold}{p}; {m.note}")


def to_json(result: GateResult) -> str:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    d = result.to_dict()
    d["metrics"] = [{k: clean(v) for k, v in m.items()} for m in d["metrics"]]
    return json.dumps(d, indent=1)
