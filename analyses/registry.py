"""The list of analyses: name -> function and one-line description, for the CLI,
Run.analyze and the report. Add an analysis here and it is listed everywhere."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

from tracekit.errors import TracekitError


@dataclass(frozen=True)
class Analysis:
    name: str
    module: str  # analyses.<module> holds a function of the same name
    description: str
    needs_other_run: bool = False  # trace_diff compares two runs

    @property
    def func(self) -> Callable:
        return getattr(importlib.import_module(f"analyses.{self.module}"), self.name)

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return dict(list(inspect.signature(self.func).parameters.items())[1:])


_ANALYSES = (
    Analysis("temporal_breakdown", "temporal_breakdown", "idle / compute / non-compute time per rank or step"),
    Analysis("kernel_classification", "kernel_classification", "class (communication/memory/compute/other) of every GPU op name"),
    Analysis("comm_comp_overlap", "comm_comp_overlap", "communication hidden under compute, and exposed communication"),
    Analysis("idle_time_breakdown", "idle_time_breakdown", "idle time per stream: host wait / kernel wait / other"),
    Analysis("kernel_breakdown", "kernel_breakdown", "count / total / mean / p50 / p95 / max per kernel name or class"),
)

REGISTRY: dict[str, Analysis] = {a.name: a for a in _ANALYSES}


def get(name: str) -> Analysis:
    try:
        return REGISTRY[name]
    except KeyError:
        raise TracekitError(f"NAME {name!r}: no such analysis; `tracekit analyze --list` shows them "
                            f"({', '.join(REGISTRY)})") from None


def run_analysis(run, name: str, **params):
    """Call analysis NAME on run with params; unknown parameters are the user's error."""
    a = get(name)
    accepted = a.parameters
    unknown = [k for k in params if k not in accepted]
    if unknown:
        raise TracekitError(f"{name}: unknown parameter(s) {', '.join(unknown)}; it takes {', '.join(accepted)}")
    return a.func(run, **params)
