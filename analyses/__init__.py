"""Analyses over a tracekit store: one .sql file (documented columns) plus one small
function per analysis, each taking a Run (or anything with .sql(query, params)) and
returning a pandas DataFrame. `REGISTRY` lists them; `analyze(run, name, **params)`
runs one by name.

    import tracekit, analyses
    run = tracekit.open("runs/job42/")
    analyses.temporal_breakdown(run)
    run.analyze("comm_comp_overlap", by_step=True)
"""
from __future__ import annotations

from .comm_comp_overlap import comm_comp_overlap
from .idle_time_breakdown import idle_time_breakdown
from .kernel_breakdown import kernel_breakdown
from .kernel_classes import DEFAULT_RULES, classify
from .kernel_classification import kernel_classification
from .registry import REGISTRY, run_analysis as analyze
from .temporal_breakdown import temporal_breakdown

__all__ = ["REGISTRY", "analyze", "DEFAULT_RULES", "classify", "comm_comp_overlap", "idle_time_breakdown",
           "kernel_breakdown", "kernel_classification", "temporal_breakdown"]
