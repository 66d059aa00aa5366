"""Capture a real run: torch.profiler per rank, the flight recorder as JSON, and run.json.

torch is optional for tracekit: it is imported only when a capture starts, and its absence is
reported as a TracekitError naming the `capture` extra.
"""
from __future__ import annotations

from .session import ENV_OUT_DIR, profile, trace_name
from .teardown import end_process

__all__ = ["profile", "trace_name", "ENV_OUT_DIR", "end_process"]
