"""Ingest: a directory of per-rank traces -> a committed store.

Owns: finding trace files, deciding what changed since the last ingest, running
the per-file map (kineto.ingest_kineto) on an executor, and committing the
result atomically (see store.manifest). Nothing is committed unless every file
that had to be read was read: a bad file leaves the previous store as it was.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field

from ..errors import NotATraceError, StoreError, TraceFileError, TracekitError
from ..store import default_store_dir, writer_lock
from ..store import manifest as _manifest
from ..store.manifest import Manifest, SourceEntry
from ..store.schema import SCHEMA_VERSION, TABLES
from .executor import Executor, parse_executor, run_dask
from .flight_recorder import FR_SUFFIXES, ingest_flight_recorder, is_fr_candidate
from .kineto import FileResult, ingest_kineto
from .nccl import INSPECTOR_SUFFIXES, ingest_inspector, ingest_nccl_tests, is_inspector_candidate
from .worker import run_pool

TRACE_SUFFIXES = (".json", ".json.gz")
_SNIFF_BYTES = 1 << 20
RANK_FROM_CHOICES = ("auto", "filename", "order")


@dataclass
class IngestReport:
    store_dir: str
    ingested: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # not traces, with the reason
    failed: dict[str, str] = field(default_factory=dict)  # bad traces left out (--skip-bad)
    warnings: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0


_QUICK_BYTES = 1 << 16


def _is_trace_start(head: bytes) -> bool:
    """True when a prefix of the file already shows a trace; a prefix that says so, the whole 1 MB head
    says so too (the checks below only look for markers)."""
    text = head.lstrip()
    if text[:1] == b"[":
        return b'"ph"' in text[:65536]
    return text[:1] == b"{" and b'"traceEvents"' in head


def _sniff(path: str) -> str:
    """'trace', or raise NotATraceError / TraceFileError."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as e:
        raise TraceFileError(path, f"cannot read the file ({e.strerror})") from None
    if head[:2] == b"\x1f\x8b":
        try:
            # the first 64 KB settle almost every trace (traceEvents comes after a small header): a
            # thousand-rank directory is sniffed serially before the pool starts, so inflate no more
            quick = zlib.decompressobj(31).decompress(head, _QUICK_BYTES)
            if _is_trace_start(quick):
                return "trace"
            head = zlib.decompressobj(31).decompress(head, _SNIFF_BYTES)
        except zlib.error as e:
            raise TraceFileError(path, f"gzip data is corrupt ({e}); copy the file again or re-export the trace") from None
    text = head.lstrip()
    if not text:
        raise TraceFileError(path, "the file is empty")
    if text[:1] == b"[":
        if b'"ph"' in text[:65536] or text[1:].lstrip()[:1] in (b"]", b""):
            return "trace"
        raise NotATraceError(path, "a JSON array without trace events")
    if text[:1] != b"{":
        raise TraceFileError(path, "not JSON (expected a trace object or event array)")
    if b'"traceEvents"' in head:
        return "trace"
    if len(head) < _SNIFF_BYTES and os.path.getsize(path) < _SNIFF_BYTES and not path.endswith(".gz"):
        import msgspec

        try:
            msgspec.json.decode(head)
        except msgspec.DecodeError as e:
            raise TraceFileError(path, f"not valid JSON ({e})") from None
        except RecursionError:
            raise TraceFileError(path, "JSON nested too deeply to read; not a profiler trace?") from None
    raise NotATraceError(path, "JSON without a traceEvents array (not a Kineto trace)")


def discover(trace_dir: str, store_dir: str | None = None) -> list[str]:
    """Candidate trace files under trace_dir, relative, sorted; hidden dirs skipped."""
    trace_dir = os.path.abspath(trace_dir)
    store_dir = os.path.abspath(store_dir) if store_dir else None
    found = []
    for root, dirs, files in os.walk(trace_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.join(root, d) != store_dir)
        for name in files:
            if name.endswith(TRACE_SUFFIXES + FR_SUFFIXES) and not name.startswith("."):
                found.append(os.path.relpath(os.path.join(root, name), trace_dir))
            elif name.endswith(INSPECTOR_SUFFIXES) and not name.startswith(".") \
                    and is_inspector_candidate(os.path.join(root, name)):
                # other *.log files are not ours to list as "not traces"
                found.append(os.path.relpath(os.path.join(root, name), trace_dir))
    return sorted(found)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


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
    ex = parse_executor(executor)
    if jobs is not None and ex.kind == "dask":
        raise TracekitError(f"--jobs applies to the local executor, not --executor {ex}; the Dask cluster's "
                            "workers set the parallelism")
    if jobs is not None and ex.jobs is not None and jobs != ex.jobs:
        raise TracekitError(f"--jobs {jobs} and --executor {ex} disagree; give one of them")
    jobs = jobs or ex.jobs
    trace_dir = os.path.abspath(trace_dir)
    store_dir = os.path.abspath(store_dir or default_store_dir(trace_dir))
    report = IngestReport(store_dir=store_dir)
    try:
        os.makedirs(store_dir, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{store_dir}: cannot create the store ({e.strerror}); pass --store DIR somewhere writable") from None

    with writer_lock(store_dir, on_wait=on_wait):
        old = None if force else _load_compatible(store_dir)
        manifest = Manifest(trace_dir=trace_dir)
        todo: list[tuple[str, str]] = []  # (source, sha256)
        fr_todo: set[str] = set()  # sources in todo that are flight-recorder dumps
        insp_todo: set[str] = set()  # sources in todo that are NCCL Inspector logs
        stats: dict[str, os.stat_result] = {}
        for source in discover(trace_dir, store_dir):
            path = os.path.join(trace_dir, source)
            st = os.stat(path)
            stats[source] = st
            prev = old.sources.get(source) if old else None
            if prev and prev.size == st.st_size and prev.mtime_ns == st.st_mtime_ns and rank_from == "auto":
                manifest.sources[source] = prev
                report.unchanged.append(source)
                continue
            if old and source in old.skipped and prev is None and _manifest.skip_matches(old.skipped[source], st):
                manifest.skipped[source] = old.skipped[source]
                report.skipped[source] = _manifest.skip_reason(old.skipped[source])
                continue
            if path.endswith(INSPECTOR_SUFFIXES) or (not path.endswith(FR_SUFFIXES) and is_inspector_candidate(path)):
                insp_todo.add(source)  # detected by content: one Inspector record per line
                todo.append((source, _sha256(path)))
                continue
            try:
                if path.endswith(FR_SUFFIXES):
                    fr_todo.add(source)  # a pickle here can only be a flight-recorder dump
                else:
                    _sniff(path)
            except NotATraceError as e:
                if is_fr_candidate(path):
                    fr_todo.add(source)
                    todo.append((source, _sha256(path)))
                    continue
                manifest.skipped[source] = _manifest.skip_entry(st, e.reason)
                report.skipped[source] = e.reason
                continue
            except TraceFileError as e:
                if not skip_bad:
                    raise
                report.failed[source] = e.reason
                continue
            digest = _sha256(path)
            if prev and prev.sha256 == digest and rank_from == "auto":
                prev.mtime_ns = st.st_mtime_ns
                manifest.sources[source] = prev
                report.unchanged.append(source)
                continue
            todo.append((source, digest))
        if old:
            report.removed = sorted(set(old.sources) - set(manifest.sources) - {s for s, _ in todo})

        if not manifest.sources and not todo:
            what = f"; not traces: {', '.join(sorted(report.skipped))}" if report.skipped else ""
            bad = f"; unreadable: {', '.join(sorted(report.failed))}" if report.failed else ""
            raise TracekitError(f"{trace_dir}: no Kineto traces found (*.json, *.json.gz with traceEvents){what}{bad}")

        forced = _forced_ranks(rank_from, sorted({*(k for k, e in manifest.sources.items() if e.kind == "trace"),
                                                  *(s for s, _ in todo if s not in fr_todo | insp_todo)}))
        # nccl-tests references: passed ones are read again; earlier ones are kept as they were
        ref_paths = {_NCCL_TESTS_PREFIX + os.path.abspath(p): p for p in nccl_tests}
        if old:
            for key, e in old.sources.items():
                if e.kind == "nccl_tests" and key not in ref_paths:
                    manifest.sources[key] = e
            report.removed = [k for k in report.removed if k not in manifest.sources]
        gen = uuid.uuid4().hex[:12]
        staging = os.path.join(store_dir, "staging", gen)
        try:
            refs = _run_nccl_tests(ref_paths, staging)  # first: a bad reference fails before the long part
            results = _run(trace_dir, [t for t in todo if t[0] not in fr_todo | insp_todo], staging, rank_from, forced,
                           jobs, skip_bad, report, progress, ex)
            # the rank of a dump comes from its file name, of an Inspector log from its records' headers
            results.update(_run_small(ingest_flight_recorder, "fr", trace_dir, [s for s, _ in todo if s in fr_todo],
                                      staging, skip_bad, report))
            results.update(_run_small(ingest_inspector, "ni", trace_dir, [s for s, _ in todo if s in insp_todo],
                                      staging, skip_bad, report))
            for source, digest in todo:
                if source not in results:
                    continue
                r = results[source]
                st = stats[source]
                manifest.sources[source] = SourceEntry(
                    size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=digest, rank=r.rank, rank_source=r.rank_source,
                    event_count=r.event_count, lost_event_count=r.lost_event_count, warnings=r.warnings,
                    files={}, world_size=r.world_size, ingested_ns=time.time_ns(),
                    kind="flight_recorder" if source in fr_todo else "nccl_inspector" if source in insp_todo else "trace")
                if r.warnings:
                    report.warnings[source] = r.warnings
                report.ingested.append(source)
            for key, (r, st, digest) in refs.items():
                manifest.sources[key] = SourceEntry(
                    size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=digest, rank=r.rank, rank_source=r.rank_source,
                    event_count=r.event_count, lost_event_count=0, warnings=[], files={}, ingested_ns=time.time_ns(),
                    kind="nccl_tests")
                results[key] = r
            _check_ranks(trace_dir, manifest)
            if not manifest.sources:
                raise TracekitError(f"{trace_dir}: no trace could be ingested: " +
                                    "; ".join(f"{k}: {v}" for k, v in report.failed.items()))
            _commit(store_dir, gen, old, manifest, results)
        finally:
            shutil.rmtree(os.path.join(store_dir, "staging"), ignore_errors=True)
        _remove_orphans(store_dir, manifest)
    report.seconds = time.perf_counter() - t0
    return report


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


def _run(trace_dir, todo, staging, rank_from, forced, jobs, skip_bad, report, progress,
         ex: Executor = Executor("local")) -> dict[str, FileResult]:
    if not todo:
        return {}
    tasks = [{"path": os.path.join(trace_dir, s), "source": s, "stage": os.path.join(staging, f"{i:06d}"),
              "rank_from": rank_from, "forced_rank": forced.get(s)} for i, (s, _) in enumerate(todo)]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    results: dict[str, FileResult] = {}
    bar = _progress(progress, len(tasks))

    def done(source: str, get) -> None:
        try:
            results[source] = get()
        except TraceFileError as e:
            if not skip_bad:
                raise
            report.failed[source] = e.reason
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
                done(t["source"], lambda t=t: ingest_kineto(t["path"], t["source"], t["stage"],
                                                           rank_from=t["rank_from"], forced_rank=t["forced_rank"],
                                                           converters=converters))
        else:
            run_pool(tasks, jobs, done)
    finally:
        if bar:
            bar.close()
    return results


_NCCL_TESTS_PREFIX = "nccl-tests:"  # manifest key of a reference file (it lives outside the trace directory)


def _run_nccl_tests(ref_paths: dict[str, str], staging: str) -> dict:
    """key -> (FileResult, stat, sha256) per nccl-tests file; any unreadable one is the user's error, named
    with its option (never skipped: a missing reference would silently change the report)."""
    out = {}
    for i, (key, given) in enumerate(sorted(ref_paths.items())):
        path = os.path.abspath(given)
        try:
            st = os.stat(path)
            r = ingest_nccl_tests(path, path, os.path.join(staging, f"nt{i:06d}"))
        except FileNotFoundError:
            raise TracekitError(f"--nccl-tests {given}: no such file") from None
        except OSError as e:
            raise TracekitError(f"--nccl-tests {given}: cannot read the file ({e.strerror})") from None
        except TraceFileError as e:
            raise TracekitError(f"--nccl-tests {given}: {e.reason}") from None
        out[key] = (r, st, _sha256(path))
    return out


def _run_small(read, prefix: str, trace_dir, sources, staging, skip_bad, report) -> dict[str, FileResult]:
    """Small side inputs (flight-recorder dumps, NCCL Inspector logs) are read in-process, one by one."""
    results = {}
    for i, source in enumerate(sources):
        try:
            results[source] = read(os.path.join(trace_dir, source), source, os.path.join(staging, f"{prefix}{i:06d}"))
        except TraceFileError as e:
            if not skip_bad:
                raise
            report.failed[source] = e.reason
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


def _commit(store_dir: str, gen: str, old: Manifest | None, manifest: Manifest, results: dict[str, FileResult]) -> None:
    """Move staged files to their final names, then switch the manifest."""
    for source, r in results.items():
        if source not in manifest.sources:
            continue
        key = hashlib.sha1(source.encode()).hexdigest()[:12]
        files: dict[str, list[str]] = {}
        for table in TABLES:
            rel_dir = os.path.join(table, f"rank={r.rank}")
            files[table] = []
            if not r.staged.get(table):  # no empty rank directories (10 tables x 1024 ranks, removed again later)
                os.makedirs(os.path.join(store_dir, table), exist_ok=True)
                continue
            os.makedirs(os.path.join(store_dir, rel_dir), exist_ok=True)
            for i, staged in enumerate(r.staged.get(table, [])):
                rel = os.path.join(rel_dir, f"{key}-{gen}-{i}.parquet")
                os.replace(staged, os.path.join(store_dir, rel))
                files[table].append(rel)
        manifest.sources[source].files = files
    _manifest.save(store_dir, manifest)


def _remove_orphans(store_dir: str, manifest: Manifest) -> None:
    """Delete Parquet files the manifest no longer names (replaced partitions,
    leftovers of an interrupted ingest)."""
    keep = {os.path.normpath(p) for e in manifest.sources.values() for ps in e.files.values() for p in ps}
    for table in TABLES:
        top = os.path.join(store_dir, table)
        for root, _dirs, files in os.walk(top):
            for name in files:
                rel = os.path.normpath(os.path.relpath(os.path.join(root, name), store_dir))
                if rel not in keep:
                    try:
                        os.unlink(os.path.join(root, name))
                    except OSError:
                        pass
        for root, dirs, files in os.walk(top, topdown=False):
            if root != top and not dirs and not files:
                try:
                    os.rmdir(root)
                except OSError:
                    pass
