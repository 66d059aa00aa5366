"""Shared fixtures: paths to the real traces in ../shared, tiny traces built in code."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_TRACES = SHARED / "traces"


def _ci_with_shared() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1") and SHARED.is_dir()


def shared_trace_dir(rel: str = "") -> Path:
    """A directory under ../shared/traces. Absent: the test skips, except in a CI run (CI=true) that
    has ../shared beside the repo, where it fails: there a skip would hide a lost or renamed trace."""
    p = SHARED_TRACES / rel
    if not p.exists():
        why = f"{p} not present (the shared traces live beside the repo, not in it)"
        if _ci_with_shared():
            pytest.fail(f"{why}; this CI run has {SHARED}, so every shared-trace test must run", pytrace=False)
        pytest.skip(why)
    return p


def has_shared_trace(rel: str) -> bool:
    """For a test that reads a shared trace when there is one and a bundled one else: whether
    ../shared/traces/REL is there. In a CI run that has ../shared, its absence fails the test instead
    (as shared_trace_dir): the fallback would hide a lost or renamed trace."""
    if (SHARED_TRACES / rel).exists():
        return True
    if _ci_with_shared():
        pytest.fail(f"{SHARED_TRACES / rel} not present; this CI run has {SHARED}, so the test must read it",
                    pytrace=False)
    return False


@pytest.fixture
def shared():
    return shared_trace_dir


def write_trace(path: Path, events: list[dict], *, rank: int | None = 0, world_size: int = 1,
                base_ns: int | None = None, extra: dict | None = None, gz: bool | None = None,
                info_after: bool = True, pg_config: list[dict] | None = None) -> Path:
    """Write a Kineto-shaped trace. distributedInfo goes after traceEvents as
    torch.profiler writes it (info_after) or before it; pg_config: its process groups
    ({pg_name, pg_desc, ranks})."""
    doc: dict = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms"}
    if base_ns is not None:
        doc["baseTimeNanoseconds"] = base_ns
    if extra:
        doc.update(extra)
    info = {"backend": "gloo", "rank": rank, "world_size": world_size} if rank is not None else None
    if info is not None and pg_config is not None:
        info.update(pg_count=len(pg_config), pg_config=[{"backend_config": "cpu:gloo", "pg_size": len(g["ranks"]), **g}
                                                         for g in pg_config])
    if info and not info_after:
        doc["distributedInfo"] = info
    doc["traceEvents"] = events
    if info and info_after:
        doc["distributedInfo"] = info
    doc["traceName"] = str(path)
    text = json.dumps(doc, indent=2).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz if gz is not None else str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


def tiny_events(n_steps: int = 2, t0_us: float = 1000.0) -> list[dict]:
    """A small but complete GPU-style trace: steps, ops, launches, kernels, flows, memory, metadata."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 7, "args": {"name": "thread 7 (python)"}},
    ]
    t = t0_us
    corr = 1
    for s in range(n_steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 100, "tid": 7,
                   "ts": t, "dur": 100.0, "args": {"External id": 1000 + s}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 7, "ts": t + 10, "dur": 20.5,
                   "args": {"External id": 10 + s, "Input Dims": [[4, 4], [4, 4]], "Input type": ["float", "float"],
                            "Sequence number": s, "Record function id": 0}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 7, "ts": t + 12,
                   "dur": 5, "args": {"External id": 10 + s, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t + 20, "dur": 30,
                   "args": {"External id": 10 + s, "device": 0, "stream": 7, "correlation": corr,
                            "grid": [1, 2, 3], "block": [128, 1, 1], "registers per thread": 32}})
        ev.append({"ph": "s", "id": corr, "pid": 100, "tid": 7, "ts": t + 12, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 20, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        ev.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 100, "tid": 7, "ts": t + 11,
                   "s": "t", "args": {"Addr": 4096 * (s + 1), "Bytes": 64, "Total Allocated": 64 * (s + 1),
                                      "Total Reserved": 2048, "Device Type": 1, "Device Id": 0}})
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                   "ts": t + 60, "dur": 4, "args": {"device": 0, "stream": 7, "correlation": corr + 1,
                                                    "bytes": 1024, "memory bandwidth (GB/s)": 0.256}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 100, "tid": 7, "ts": t + 40,
                   "dur": 3, "args": {"cbid": 41, "correlation": corr + 1}})
        corr += 2
        t += 200
    return ev


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    write_trace(d / "rank0.trace.json.gz", tiny_events(), rank=0, world_size=2)
    write_trace(d / "rank1.trace.json", tiny_events(t0_us=1005.0), rank=1, world_size=2)
    return d


@pytest.fixture(scope="session")
def memory_layout_run(tmp_path_factory) -> Path:
    """A tiny 2-rank DDP run of the layouts trainer recorded with the allocator's [memory] events (seconds, once a
    session; needs torch): a real CPU run whose memory peak tests judge against a device capacity they choose."""
    pytest.importorskip("torch", reason="recording a run needs torch (pip install 'tracekit[capture]')")
    from tracekit.capture.layouts import LayoutConfig, run

    d = tmp_path_factory.mktemp("memory_layout") / "ddp"
    run(LayoutConfig(out_dir=str(d), layout="ddp", ranks=2, d_model=64, layers=2, heads=4, vocab=256, seq_len=32,
                     batch_size=8, steps=2, warmup=1, timed_steps=0, profile_memory=True))
    return d


def many_rank_run(tmp_path_factory, n: int, seed: int = 3):
    """A run of n ranks made by bench/make_many_ranks.py (the bundled 4-rank gloo sample, re-timed), ingested."""
    import subprocess
    import sys

    import tracekit

    d = tmp_path_factory.mktemp(f"r{n}")
    subprocess.run([sys.executable, str(REPO / "bench" / "make_many_ranks.py"), str(n), str(d / "set"), "--seed",
                    str(seed)], check=True, capture_output=True)
    return tracekit.open(d / "set", store=str(d / "store"))
