"""The one place tracekit.capture imports torch, so the core package never needs it."""
from __future__ import annotations

import importlib

from ..errors import TracekitError

INSTALL_HINT = "pip install 'tracekit[capture]'"


def require_torch():
    """Return the torch module, or raise a TracekitError that names the `capture` extra."""
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise TracekitError(f"capturing a run needs PyTorch, which is not installed ({e}); "
                            f"install the capture extra: {INSTALL_HINT}") from None


def dist_rank_world() -> tuple[int, int, bool]:
    """(rank, world size, whether a process group is up); falls back to torchrun's env vars."""
    import os

    torch = require_torch()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), False
