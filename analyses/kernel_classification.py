"""Kernel classification per distinct GPU op name (analyses/kernel_classification.sql)."""
from __future__ import annotations

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def kernel_classification(run, rank: int | None = None, step: int | None = None, *,
                          drop_last_step: bool = False, rules=None, replace_default_rules: bool = False):
    """Class and matching rule of every GPU op name; rules (list or TOML path) override the defaults."""
    check_scope(run, rank, step)
    prepare(run, rules, replace_default_rules)
    df = query(run, "kernel_classification", rank=rank, step=step, drop_last_step=drop_last_step)
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)
