"""Kernel classification rules: the one place that says which GPU op is
communication, memory, compute or other.

Rules are ordered (class, regex) pairs; the first pattern that matches a kernel
name wins, and a name no rule matches is compute. memcpy/memset GPU ops are
memory whatever their name. Users prepend their own rules (a list, or a TOML
file with [[rule]] tables) so a custom kernel can be reclassified without
touching the defaults.
"""
from __future__ import annotations

import os
import re
from typing import Iterable, Sequence

from tracekit.errors import TracekitError

CLASSES = ("communication", "memory", "compute", "other")

# Why each rule: HTA 0.5.0 only knows ^nccl.*Kernel, so NCCL >= 2.19's
# ncclDevKernel_* is caught here by the ^nccl prefix; RCCL kernels keep nccl
# names or use rccl; vendor all-reduce kernels that bypass NCCL (vLLM/TRT-LLM
# custom all-reduce, PyTorch symmetric-memory one/two-shot, multimem) are
# communication too. hip*/rocclr copy kernels move memory: HTA's older rule
# called any ^hip kernel communication, which is wrong.
# The collective libraries' kernels (NCCL, RCCL, HCCL, MSCCL): the communication rule below, and the kernels the
# collectives views (_comm_views.sql) and doctor's compute per step (compute_per_step.sql) take as a
# collective's, both given this pattern as a bound parameter.
COMM_KERNEL_PATTERN = r"^(nccl|rccl|hccl|msccl)"

DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    ("communication", COMM_KERNEL_PATTERN),
    ("communication", r"(?i)(custom_?all_?reduce|cross_device_reduce|(one|two)_?shot_all_?reduce|multimem_all_?reduce"
                      r"|all_?reduce_kernel|allgather_kernel|reduce_scatter_kernel)"),
    ("memory", r"^(Memcpy|Memset|dma)"),
    ("memory", r"(?i)^(hip|__amd_rocclr_)\w*(memcpy|memset|copy|fill)"),
    ("other", r"Sync"),
)


def load_rules(path: str | os.PathLike) -> list[tuple[str, str]]:
    """Read [[rule]] tables (class = "...", pattern = "...") from a TOML file."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TracekitError(f"--rules {os.fspath(path)}: {e}") from None
    return [(r.get("class"), r.get("pattern")) for r in doc.get("rule", [])]


def resolve_rules(rules: Iterable[Sequence[str]] | str | os.PathLike | None = None,
                  replace_defaults: bool = False) -> list[tuple[str, str]]:
    """User rules (first) followed by the defaults, validated."""
    if isinstance(rules, (str, os.PathLike)):
        rules = load_rules(rules)
    user = [tuple(r) for r in (rules or [])]
    out = user + ([] if replace_defaults else list(DEFAULT_RULES))
    for r in out:
        if len(r) != 2 or r[0] not in CLASSES or not isinstance(r[1], str):
            raise TracekitError(f"kernel rule {r!r}: expected (class, pattern) with class in {', '.join(CLASSES)}")
        try:
            re.compile(r[1])
        except re.error as e:
            raise TracekitError(f"kernel rule {r!r}: bad pattern: {e}") from None
    return out


def classify(name: str, rules: Iterable[Sequence[str]] | None = None) -> str:
    """Python twin of the SQL classification, for callers outside the store."""
    for cls, pattern in resolve_rules(rules):
        if re.search(pattern, name):
            return cls
    return "compute"
