"""Ingest's run step: read every planned source into staged Parquet files.

Owns the per-file map: traces on the executor (in-process, the local pool or Dask), the small side
inputs (flight-recorder dumps, NCCL Inspector logs, run.json) in-process one by one, nccl-tests
references first (a bad one fails before the long part), and the progress bar. What a reader
refuses is a TraceFileError; under --skip-bad that file is left out and named in `failed`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..errors import TraceFileError, TracekitError
from .executor import Executor, run_dask
from .flight_recorder import ingest_flight_recorder
from .kineto import FileResult, ingest_task
from .nccl import ingest_inspector, ingest_nccl_tests
from .plan import Planned, sha256
from .run_manifest import ingest_run_manifest
from .worker import run_pool

# the side inputs' readers, and the prefix of their staging folders; the rank of a dump comes from its
# file name, of an Inspector log from its records' headers
_SMALL = {"flight_recorder": (ingest_flight_recorder, "fr"), "nccl_inspector": (ingest_inspector, "ni"),
          "run_manifest": (ingest_run_manifest, "rm")}


@dataclass(frozen=True)
class Read:
    """A source read into staged files, with the stat and hash its manifest entry records."""

    planned: Planned
    result: FileResult
    stat: os.stat_result
    sha256: str


def run(todo: list[Planned], staging: str, *, rank_from: str, forced: dict[str, int], only_trace: bool,
        jobs: int | None, skip_bad: bool, failed: dict[str, str], progress: bool | None, ex: Executor) -> list[Read]:
    """Read `todo` into `staging`; return what was read, in todo's order. Files left out under skip_bad
    are added to `failed`. only_trace: the run has one trace, which may name no rank (see ingest_kineto)."""
    done = {r.planned.source: r for r in _nccl_tests([t for t in todo if t.kind == "nccl_tests"], staging)}
    traces = [t for t in todo if t.kind == "trace"]
    results = _traces(traces, staging, rank_from, forced, only_trace, jobs, skip_bad, failed, progress, ex)
    done.update((t.source, Read(t, results[t.source], t.stat, t.sha256)) for t in traces if t.source in results)
    for kind, (read, prefix) in _SMALL.items():
        for i, t in enumerate(t for t in todo if t.kind == kind):
            try:
                r = read(t.path, t.source, os.path.join(staging, f"{prefix}{i:06d}"))
            except TraceFileError as e:
                if not skip_bad:
                    raise
                failed[t.source] = e.reason
                continue
            done[t.source] = Read(t, r, t.stat, t.sha256)
    return [done[t.source] for t in todo if t.source in done]


def _nccl_tests(refs: list[Planned], staging: str) -> list[Read]:
    """Any unreadable nccl-tests file is the user's error, named with its option (never skipped: a missing
    reference would silently change the report)."""
    out = []
    for i, t in enumerate(refs):
        path = os.path.abspath(t.path)
        try:
            st = os.stat(path)
            r = ingest_nccl_tests(path, path, os.path.join(staging, f"nt{i:06d}"))
        except FileNotFoundError:
            raise TracekitError(f"--nccl-tests {t.path}: no such file") from None
        except OSError as e:
            raise TracekitError(f"--nccl-tests {t.path}: cannot read the file ({e.strerror})") from None
        except TraceFileError as e:
            raise TracekitError(f"--nccl-tests {t.path}: {e.reason}") from None
        out.append(Read(t, r, st, sha256(path)))
    return out


def _traces(todo: list[Planned], staging, rank_from, forced, only_trace, jobs, skip_bad, failed, progress,
            ex: Executor) -> dict[str, FileResult]:
    if not todo:
        return {}
    tasks = [{"path": t.path, "source": t.source, "stage": os.path.join(staging, f"{i:06d}"),
              "rank_from": rank_from, "forced_rank": forced.get(t.source), "only_trace": only_trace}
             for i, t in enumerate(todo)]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    results: dict[str, FileResult] = {}
    bar = _progress(progress, len(tasks))

    def done(source: str, get) -> None:
        try:
            results[source] = get()
        except TraceFileError as e:
            if not skip_bad:
                raise
            failed[source] = e.reason
        finally:
            if bar:
                bar.advance()

    # One file alone gets two DuckDB converters (both cores); with several
    # files the pool already keeps every core busy.
    converters = 2 if len(tasks) == 1 and (os.cpu_count() or 1) >= 2 else 1
    try:
        if ex.kind == "dask":
            run_dask(ex, tasks, done)
        elif jobs == 1:  # in-process: no start-up cost for the common one-file case
            for t in tasks:
                done(t["source"], lambda t=t: ingest_task(t, converters=converters))
        else:
            run_pool(tasks, jobs, done)
    finally:
        if bar:
            bar.close()
    return results


class _Bar:
    def __init__(self, total: int):
        from rich.progress import Progress

        self._p = Progress(transient=True)
        self._p.start()
        self._task = self._p.add_task("ingesting traces", total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def close(self) -> None:
        self._p.stop()


def _progress(progress: bool | None, total: int):
    if progress is None:
        progress = sys.stderr.isatty()
    return _Bar(total) if progress and total > 1 else None
