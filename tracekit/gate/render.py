"""Gate results as text for people and CI: a short table, Markdown (a CI job summary) and JUnit XML
(one test case per metric), all in human units; and JSON with the raw numbers (tracekit.output)."""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from .. import output
from . import GateResult, MetricResult

# a metric family's unit (gate.config.FAMILIES) -> tracekit.output's unit for human text
_HUMAN_UNIT = {"ns": "ns", "bytes": "bytes", "GB/s": "gbps"}


def _num(v, digits=4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.{digits}g}" if abs(v) < 1e6 else f"{v:.0f}"


def _value(v, unit: str) -> str:
    """A value in the metric's unit, for people: 89.5 ms rather than 89478383 (ns)."""
    shown = output.human(v, _HUMAN_UNIT.get(unit))
    if shown is not None:
        return shown
    text = _num(v)
    return f"{text} {unit}" if text and unit != "%" else f"{text}%" if text else ""


def _threshold(m: MetricResult) -> str:
    """A relative threshold as given ("5%"); an absolute one in the metric's unit, for people."""
    return m.threshold if m.threshold.endswith("%") else _value(float(m.threshold), m.unit)


def verdict(result: GateResult) -> str:
    if result.passed:
        return "PASS"
    return "REGRESSION" if result.mode == "regression" else "OVER ERROR BUDGET"


def summary_rows(result: GateResult) -> list[dict]:
    """The short table for people: one row per metric, values in human units (89.5 ms, 1.2 GB/s) under the
    metric's name without its raw unit (`busbw:all_reduce` reads 51.9 MB/s)."""
    return [{"metric": output.people_name(m.metric), "status": m.status, "baseline": _value(m.baseline_median, m.unit),
             "candidate": _value(m.candidate_median, m.unit),
             "change": "" if m.change_pct is None else f"{m.change_pct:+.1f}%",
             "threshold": _threshold(m), "p_value": _num(m.p_value, 3), "n": f"{m.n_baseline}/{m.n_candidate}",
             "note": m.note} for m in result.metrics]


def markdown(result: GateResult, baseline: str, candidate: str) -> str:
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "❔", "missing": "➖"}
    lines = [f"### tracekit gate: {verdict(result)}", "",
             f"Baseline `{baseline}`, {'prediction' if result.mode == 'prediction' else 'candidate'} "
             f"`{candidate}`; Mann-Whitney alpha {result.alpha:g}; thresholds from {result.config_source}.", "",
             "| | metric | baseline | candidate | change | threshold | p | n | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r, m in zip(summary_rows(result), result.metrics):
        # the metric's own name, as a config's thresholds name it
        lines.append(f"| {icon[m.status]} | `{m.metric}` | {r['baseline']} | {r['candidate']} | {r['change']} "
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
    return (f"{m.metric}: baseline median {_value(m.baseline_median, m.unit)}, candidate "
            f"{_value(m.candidate_median, m.unit)}{change}, threshold {_threshold(m)}{p}; {m.note}")


def to_json(result: GateResult) -> str:
    """The full result for scripts: raw numbers in each metric's unit, null where there is none."""
    return output.to_json(result.to_dict())
