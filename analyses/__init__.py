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

from .backward_collectives import backward_collectives
from .comm_comp_overlap import comm_comp_overlap
from .compute_per_step import compute_per_step
from .exposed_comm import exposed_comm
from .critical_path import critical_path, critical_path_summary
from .host_time import data_loading, sync_calls
from .idle_time_breakdown import idle_time_breakdown
from .kernel_breakdown import kernel_breakdown
from .kernel_classes import DEFAULT_RULES, classify
from .attribution import gpu_time_by_annotation, gpu_time_by_cpu_op, kernel_sequences
from .kernel_classification import kernel_classification
from .kernel_launch import kernel_launch_outliers, kernel_launch_stats
from .memory import (memory_bandwidth, memory_bandwidth_summary, memory_blocks, memory_breakdown,
                     memory_category_timeline, memory_model_state, memory_peak, memory_timeline,
                     parameter_bytes)
from .queue_length import queue_length, queue_length_summary
from .registry import REGISTRY, run_analysis as analyze
from .small_kernels import small_kernels
from .temporal_breakdown import temporal_breakdown
from .trace_diff import trace_diff

__all__ = ["REGISTRY", "analyze", "DEFAULT_RULES", "classify", "comm_comp_overlap", "exposed_comm", "idle_time_breakdown",
           "kernel_breakdown", "kernel_classification", "temporal_breakdown", "gpu_time_by_annotation",
           "gpu_time_by_cpu_op", "kernel_sequences", "kernel_launch_outliers", "kernel_launch_stats", "memory_bandwidth",
           "memory_bandwidth_summary", "memory_blocks", "memory_breakdown", "memory_category_timeline", "memory_model_state", "parameter_bytes", "memory_peak", "memory_timeline", "queue_length", "queue_length_summary", "trace_diff", "critical_path", "critical_path_summary",
           "data_loading", "sync_calls", "small_kernels", "compute_per_step", "backward_collectives"]
