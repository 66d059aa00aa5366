"""run.json: what a trace directory cannot tell by itself (job shape, versions, measured step times).

Each rank describes itself; rank 0 gathers the descriptions over the process group and writes one
manifest. Step times here are wall-clock times taken outside the profiler, the ground truth that
replay predictions are compared with.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket

from ._torch import require_torch

MANIFEST_NAME = "run.json"
MANIFEST_VERSION = 1
HOST_LABEL_ENV = "TRACEKIT_HOST_LABEL"


def local_info(rank: int, step_times_ns: list[int], profiled_steps: list[int], trace_file: str | None,
               fr_file: str | None, fr_entry_count: int) -> dict:
    """What this rank knows about itself."""
    torch = require_torch()
    return {
        "rank": rank,
        # A testbed host (network namespace) shares the machine's hostname; its label tells ranks apart.
        "host": os.environ.get(HOST_LABEL_ENV) or socket.gethostname(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "device": _device_name(torch),
        "step_times_ns": [int(t) for t in step_times_ns],
        "profiled_steps": profiled_steps,
        "trace_file": trace_file,
        "flight_recorder_file": fr_file,
        "flight_recorder_entry_count": fr_entry_count,
        "net_ifname": os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME"),
    }


def gather(info: dict, world_size: int, distributed: bool) -> list[dict] | None:
    """All ranks' infos on rank 0 (None elsewhere); the local one alone without a process group."""
    if not distributed or world_size == 1:
        # Without a process group only rank 0 may write run.json, knowing only itself.
        return [info] if info["rank"] == 0 else None
    dist = require_torch().distributed
    out: list | None = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(info, out, dst=0)
    return out


def build(rank_infos: list[dict], world_size: int, backend: str | None, parallel: dict, steps: int,
          warmup: int, extra: dict) -> dict:
    torch = require_torch()
    rank_infos = sorted(rank_infos, key=lambda r: r["rank"])
    step_count = max((len(r["step_times_ns"]) for r in rank_infos), default=0)
    # The job's step time is the slowest rank's: a synchronous step ends when every rank ends.
    job_step_times_ns = [max(r["step_times_ns"][i] for r in rank_infos if i < len(r["step_times_ns"]))
                         for i in range(step_count)]
    return {
        "tracekit_run_manifest": MANIFEST_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world_size,
        "backend": backend,
        "hostnames": sorted({r["host"] for r in rank_infos}),
        "device_names": sorted({r["device"] for r in rank_infos}),
        "torch_version": torch.__version__,
        "nccl_version": _nccl_version(torch),
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "parallel": parallel,
        "profiler": {"warmup_steps": warmup, "active_steps": steps},
        "step_count": step_count,
        "step_times_ns": job_step_times_ns,
        "ranks": rank_infos,
        **extra,
    }


def write(out_dir: str, manifest: dict) -> str:
    path = os.path.join(out_dir, MANIFEST_NAME)
    tmp = os.path.join(out_dir, f".{MANIFEST_NAME}.partial")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read(path: str) -> dict:
    """A run manifest file (run.json) as a dict. A file that cannot be read, or that does not hold a JSON
    object, is a TraceFileError naming it. Ingest reads it into the store; everything after reads the store."""
    from ..errors import TraceFileError

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise TraceFileError(path, f"cannot read the run manifest: {e}") from None
    except RecursionError:
        raise TraceFileError(path, "cannot read the run manifest: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise TraceFileError(path, f"cannot read the run manifest: a JSON {type(doc).__name__}, not an object")
    return doc


def _device_name(torch) -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def _nccl_version(torch) -> str | None:
    try:
        if not torch.cuda.is_available():
            return None
        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # a CUDA build without NCCL: the version is simply unknown
        return None
