"""Ingest: a directory of per-rank traces -> a committed store.

Three steps, one module each: plan.py finds the inputs, states each one's kind and decides what changed
since the last ingest; runner.py reads what has to be read (the per-file map, on an executor) into
staging; the commit (store/commit.py) moves the staged files to their final names and switches the
manifest. Nothing is committed unless every file that had to be read was read: a bad file leaves the
previous store as it was. This module holds the three together under the store's writer lock.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..errors import StoreError, TracekitError
from ..store import commit as _commit
from ..store import default_store_dir, writer_lock
from ..store import manifest as _manifest
from ..store.manifest import Manifest, SourceEntry
from ..store.schema import SCHEMA_VERSION
from .executor import Executor, parse_executor
from .plan import REPORTED_KINDS, Plan, discover, plan
from .kineto import ONLY_TRACE, ONLY_TRACE_NOTE, decoder_in_use, decoder_missing
from .runner import Read, run

__all__ = ["IngestReport", "ingest", "discover", "RANK_FROM_CHOICES"]

RANK_FROM_CHOICES = ("auto", "filename", "order")


@dataclass
class IngestReport:
    store_dir: str
    ingested: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # not traces, with the reason
    failed: dict[str, str] = field(default_factory=dict)  # bad traces left out (--skip-bad)
    unopened: dict[str, str] = field(default_factory=dict)  # FIFOs, devices, symlink loops, with the reason
    warnings: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # what ingest assumed, per source
    seconds: float = 0.0
    # traces were read without the compiled events decoder, which this installation lacks: why, and what to do
    decoder_note: str | None = None


def ingest(trace_dir: str, store_dir: str | None = None, *, rank_from: str = "auto", jobs: int | None = None,
           skip_bad: bool = False, force: bool = False, progress: bool | None = None,
           on_wait=None, nccl_tests: list[str] | tuple[str, ...] = (), executor: str | None = None) -> IngestReport:
    """Bring the store of trace_dir up to date with the traces in it.

    rank_from: "auto" (distributedInfo, else file name), "filename", "order"
    (sorted file names get ranks 0..N-1) or "regex:<pattern with one group>".
    nccl_tests: nccl-tests result files (JSON or text) to keep as the reference bandwidth curve; files given
    by an earlier ingest stay until --force.
    executor: where the per-file map runs: "local" (default), "local[N]" or "dask://HOST:PORT" (see
    executor.py; with Dask the trace directory and the store must be on a filesystem the workers share).
    Raises TracekitError subclasses for bad input; the store is then unchanged.
    """
    t0 = time.perf_counter()
    if not os.path.isdir(trace_dir):
        raise TracekitError(f"{trace_dir}: not a directory; pass the directory that holds the per-rank traces")
    if rank_from not in RANK_FROM_CHOICES and not rank_from.startswith("regex:"):
        raise TracekitError(f"--rank-from {rank_from!r}: use one of {', '.join(RANK_FROM_CHOICES)} or 'regex:<pattern>'")
    ex, jobs = _executor(executor, jobs)
    trace_dir = os.path.abspath(trace_dir)
    store_dir = os.path.abspath(store_dir or default_store_dir(trace_dir))
    report = IngestReport(store_dir=store_dir)
    try:
        os.makedirs(store_dir, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{store_dir}: cannot create the store ({e.strerror}); pass --store DIR somewhere writable") from None

    with writer_lock(store_dir, on_wait=on_wait):
        old = None if force else _load_compatible(store_dir)
        p = plan(trace_dir, store_dir, old, rank_from=rank_from, skip_bad=skip_bad, nccl_tests=nccl_tests)
        report.unchanged, report.removed, report.skipped, report.failed = p.unchanged, p.removed, p.skipped, p.failed
        report.unopened = p.unopened
        if not p.sources_of(REPORTED_KINDS):
            # run.json alone is no run: it is listed with the files that are not traces
            not_traces = sorted({*report.skipped, *p.sources_of(("run_manifest",))})
            what = f"; not traces: {', '.join(not_traces)}" if not_traces else ""
            bad = f"; unreadable: {', '.join(sorted(report.failed))}" if report.failed else ""
            bad += f"; not regular files (not opened): {', '.join(sorted(p.unopened))}" if p.unopened else ""
            raise TracekitError(f"{trace_dir}: no Kineto traces found (*.json, *.json.gz with traceEvents){what}{bad}")
        gen = _commit.new_generation()
        try:
            traces = p.sources_of(("trace",))
            read = run(p.todo, _commit.staging_dir(store_dir, gen), rank_from=rank_from,
                       forced=_forced_ranks(rank_from, traces), only_trace=len(traces) == 1, jobs=jobs,
                       skip_bad=skip_bad, failed=report.failed, progress=progress, ex=ex)
            _commit_read(store_dir, gen, trace_dir, p, read, report)
            if decoder_missing() and any(d.planned.kind == "trace" for d in read):
                report.decoder_note = decoder_in_use()
        finally:
            _commit.clear_staging(store_dir)
        _commit.remove_orphans(store_dir, p.manifest, contents_changed=bool(read or p.removed))
    report.seconds = time.perf_counter() - t0
    return report


def _executor(executor: str | None, jobs: int | None) -> tuple[Executor, int | None]:
    ex = parse_executor(executor)
    if jobs is not None and ex.kind == "dask":
        raise TracekitError(f"--jobs applies to the local executor, not --executor {ex}; the Dask cluster's "
                            "workers set the parallelism")
    if jobs is not None and ex.jobs is not None and jobs != ex.jobs:
        raise TracekitError(f"--jobs {jobs} and --executor {ex} disagree; give one of them")
    return ex, jobs or ex.jobs


def _load_compatible(store_dir: str) -> Manifest | None:
    try:
        m = _manifest.load(store_dir)
    except StoreError:
        return None  # a damaged manifest: rebuild everything
    if m is None or m.schema_version != SCHEMA_VERSION:
        return None
    return m


def _forced_ranks(rank_from: str, sources: list[str]) -> dict[str, int]:
    return {s: i for i, s in enumerate(sources)} if rank_from == "order" else {}


def _commit_read(store_dir: str, gen: str, trace_dir: str, p: Plan, read: list[Read], report: IngestReport) -> None:
    """Enter what was read into the plan's manifest, move its files to their final names, switch the manifest."""
    manifest = p.manifest
    for d in read:
        r, source = d.result, d.planned.source
        manifest.sources[source] = SourceEntry(
            size=d.stat.st_size, mtime_ns=d.stat.st_mtime_ns, sha256=d.sha256, rank=r.rank, rank_source=r.rank_source,
            event_count=r.event_count, lost_event_count=r.lost_event_count, warnings=r.warnings, files={},
            world_size=r.world_size, ingested_ns=time.time_ns(), kind=d.planned.kind)
        if d.planned.kind in REPORTED_KINDS:
            if r.warnings:
                report.warnings[source] = r.warnings
            if r.rank_source == ONLY_TRACE:
                report.notes[source] = [ONLY_TRACE_NOTE]
            report.ingested.append(source)
    _check_ranks(trace_dir, manifest)
    if all(e.kind == "run_manifest" for e in manifest.sources.values()):
        raise TracekitError(f"{trace_dir}: no trace could be ingested: " +
                            "; ".join(f"{k}: {v}" for k, v in report.failed.items()))
    for d in read:
        manifest.sources[d.planned.source].files = _commit.place(store_dir, gen, d.planned.source, d.result.rank,
                                                                 d.result.staged)
    _commit.switch_manifest(store_dir, manifest)


def _check_ranks(trace_dir: str, manifest: Manifest) -> None:
    by_rank: dict[int, str] = {}
    for source in sorted(manifest.sources):
        e = manifest.sources[source]
        if e.kind != "trace":  # a rank's flight-recorder dump sits beside its trace
            continue
        if e.rank in by_rank:
            raise TracekitError(
                f"{os.path.join(trace_dir, by_rank[e.rank])} and {os.path.join(trace_dir, source)} both claim rank {e.rank}; "
                "remove one, or pass --rank-from filename/order/'regex:...' to take ranks from the file names")
        by_rank[e.rank] = source
