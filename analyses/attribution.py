"""GPU time by annotation and by CPU operator; frequent kernel sequences under an operator
(analyses/gpu_time_by_annotation.sql, gpu_time_by_cpu_op.sql, kernel_sequences.sql)."""
from __future__ import annotations

from tracekit.errors import TracekitError

from ._sql import NO_GPU, check_scope, has_gpu_ops, prepare, query, with_note


def _done(run, df, rank):
    return df if len(df) or has_gpu_ops(run, rank) else with_note(df, NO_GPU)


def gpu_time_by_annotation(run, rank: int | None = None, step: int | None = None, *, drop_last_step: bool = False):
    """GPU op time per innermost gpu_user_annotation."""
    check_scope(run, rank, step)
    prepare(run)
    df = query(run, "gpu_time_by_annotation", rank=rank, step=step, drop_last_step=drop_last_step)
    if len(df) and (df.annotation == "(unannotated)").all():
        df.attrs["note"] = "no gpu_user_annotation events in this trace"
    return _done(run, df, rank)


def gpu_time_by_cpu_op(run, rank: int | None = None, step: int | None = None, *, level: str = "both",
                       drop_last_step: bool = False):
    """GPU op time per launching CPU operator: level innermost, top, or both."""
    if level not in ("innermost", "top", "both"):
        raise TracekitError(f"level {level!r}: expected innermost, top or both")
    check_scope(run, rank, step)
    prepare(run)
    return _done(run, query(run, "gpu_time_by_cpu_op", rank=rank, step=step, level=level,
                            drop_last_step=drop_last_step), rank)


def kernel_sequences(run, rank: int | None = None, step: int | None = None, *, operator: str = "",
                     length: int = 3, top_k: int = 10):
    """Most frequent runs of `length` kernels launched under `operator` (every top-level op when empty)."""
    if int(length) < 1 or int(top_k) < 1:
        raise TracekitError("length and top_k must be at least 1")
    check_scope(run, rank, step)
    prepare(run)
    return _done(run, query(run, "kernel_sequences", rank=rank, step=step, operator=operator or None,
                            length=int(length), top_k=int(top_k)), rank)
