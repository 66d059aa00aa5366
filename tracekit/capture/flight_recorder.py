"""PyTorch's flight recorder: switched on before the process group records, dumped as JSON.

The dump is JSON on purpose: the pickle form must never be loaded from untrusted files, and a
JSON file without `traceEvents` is skipped by ingest rather than mistaken for a trace.
"""
from __future__ import annotations

import json
import os

from ._torch import require_torch

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"


def enable(entries: int = 2000) -> None:
    """Ask for a ring buffer of `entries` collectives unless the user already chose one.

    The recorder reads the variable when the first collective is recorded, so this works if
    called before any collective (ideally before init_process_group).
    """
    if entries <= 0:
        return
    os.environ.setdefault(ENV_BUFFER, str(entries))


def dump_path(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"rank{rank}.fr.json")


def dump(out_dir: str, rank: int) -> tuple[str | None, int, str | None]:
    """Write this rank's flight-recorder buffer; return (path, entry count, why not written)."""
    torch = require_torch()
    c10d = getattr(torch._C, "_distributed_c10d", None)
    dump_json = getattr(c10d, "_dump_fr_trace_json", None)
    if dump_json is None:
        return None, 0, f"torch {torch.__version__} has no JSON flight-recorder dump"
    try:
        text = dump_json(includeCollectives=True, onlyActive=False)
    except TypeError:  # older signatures take no keywords
        text = dump_json()
    except RuntimeError as e:
        return None, 0, f"flight recorder dump failed: {e}"
    doc = json.loads(text)
    path = dump_path(out_dir, rank)
    _write_json_atomic(path, doc)
    return path, len(doc.get("entries") or []), None


def _write_json_atomic(path: str, doc) -> None:
    d, name = os.path.split(path)
    tmp = os.path.join(d, f".{name}.partial")
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
