"""Kernel launch statistics and outliers (analyses/kernel_launch_stats.sql, kernel_launch_outliers.sql)."""
from __future__ import annotations

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def _run(name, run, rank, step, runtime_cutoff_ns, launch_delay_cutoff_ns, drop_last_step):
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, name, rank=rank, step=step, drop_last_step=drop_last_step,
               runtime_cutoff_ns=int(runtime_cutoff_ns), launch_delay_cutoff_ns=int(launch_delay_cutoff_ns))
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)


def kernel_launch_stats(run, rank: int | None = None, step: int | None = None, *, runtime_cutoff_ns: int = 50_000,
                        launch_delay_cutoff_ns: int = 100_000, drop_last_step: bool = False):
    """Launch delay and runtime-call duration per rank and launch call, with outlier counts."""
    return _run("kernel_launch_stats", run, rank, step, runtime_cutoff_ns, launch_delay_cutoff_ns, drop_last_step)


def kernel_launch_outliers(run, rank: int | None = None, step: int | None = None, *, runtime_cutoff_ns: int = 50_000,
                           launch_delay_cutoff_ns: int = 100_000, drop_last_step: bool = False):
    """One row per GPU op whose launch is an outlier (short op / long call / long delay)."""
    return _run("kernel_launch_outliers", run, rank, step, runtime_cutoff_ns, launch_delay_cutoff_ns, drop_last_step)
