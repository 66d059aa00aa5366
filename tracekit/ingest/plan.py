"""Ingest's plan: which files of a trace directory are inputs, of which kind, and which of them changed.

Owns discovery (which file names can be inputs), sniffing (is a .json a trace at all), and the decision
per file against the previous manifest: unchanged (kept as it was), skipped (not an input, with the
reason), failed (unreadable, under --skip-bad) or to read, with its kind stated once, here:

    trace            a Kineto trace (rank<R>.trace.json[.gz], ...)
    flight_recorder  a flight-recorder dump (JSON or pickle)
    nccl_inspector   an NCCL Inspector log
    nccl_tests       an nccl-tests result passed with --nccl-tests (outside the trace directory)
    run_manifest     the directory's run.json (capture's run manifest)
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import zlib
from dataclasses import dataclass, field

from ..errors import NotATraceError, TraceFileError
from ..store import manifest as _manifest
from ..store.manifest import Manifest
from .flight_recorder import FR_SUFFIXES, is_fr_candidate
from .nccl import INSPECTOR_SUFFIXES, is_inspector_candidate
from .run_manifest import is_run_manifest

TRACE_SUFFIXES = (".json", ".json.gz")
NCCL_TESTS_PREFIX = "nccl-tests:"  # manifest key of a reference file (it lives outside the trace directory)
# the kinds the ingest report lists (ingested / unchanged / removed): the per-rank inputs of the directory
REPORTED_KINDS = ("trace", "flight_recorder", "nccl_inspector")
_SNIFF_BYTES = 1 << 20
_QUICK_BYTES = 1 << 16


@dataclass(frozen=True)
class Planned:
    """One source to read. For nccl_tests, stat and sha256 are taken when it is read (its errors name
    the option); for the others, while planning."""

    source: str  # manifest key: path relative to the trace directory, or NCCL_TESTS_PREFIX + absolute path
    kind: str
    path: str  # what to read: absolute, or for nccl_tests the path as the user gave it
    sha256: str | None = None
    stat: os.stat_result | None = None


@dataclass
class Plan:
    manifest: Manifest  # the new manifest so far: unchanged sources and skipped files
    todo: list[Planned] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # not inputs, with the reason
    unopened: dict[str, str] = field(default_factory=dict)  # FIFOs, devices, symlink loops: never opened
    failed: dict[str, str] = field(default_factory=dict)  # unreadable, left out (--skip-bad)

    def sources_of(self, kinds) -> list[str]:
        """Sources of these kinds, kept or to read, sorted."""
        return sorted({*(k for k, e in self.manifest.sources.items() if e.kind in kinds),
                       *(p.source for p in self.todo if p.kind in kinds)})


def _is_trace_start(head: bytes) -> bool:
    """True when a prefix of the file already shows a trace; a prefix that says so, the whole 1 MB head
    says so too (the checks below only look for markers)."""
    text = head.lstrip()
    if text[:1] == b"[":
        return b'"ph"' in text[:65536]
    return text[:1] == b"{" and b'"traceEvents"' in head


def sniff(path: str) -> str:
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
    """Candidate input files under trace_dir, relative, sorted; hidden dirs skipped."""
    trace_dir = os.path.abspath(trace_dir)
    store_dir = os.path.abspath(store_dir) if store_dir else None
    found = []
    for root, dirs, files in os.walk(trace_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.join(root, d) != store_dir)
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(TRACE_SUFFIXES + FR_SUFFIXES) and not name.startswith("."):
                found.append(os.path.relpath(path, trace_dir))
            elif name.endswith(INSPECTOR_SUFFIXES) and not name.startswith(".") \
                    and (not_openable(path) or is_inspector_candidate(path)):
                # other *.log files are not ours to list as "not traces"; one we may not open is listed
                found.append(os.path.relpath(path, trace_dir))
    return sorted(found)


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def not_openable(path: str) -> str | None:
    """Why ingest must not open this path (None: a regular file, or a symlink to one). Opening a FIFO blocks
    until a writer comes, a device may never end, a symlink loop never resolves: none is a trace."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop: not followed"
        if os.path.islink(path):
            return "a symlink to nothing: not followed"
        return f"cannot be read ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    what = next((w for test, w in _SPECIAL if test(mode)), "not a regular file")
    return f"{what}, not a regular file: not opened; move it out of the trace directory"


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def plan(trace_dir: str, store_dir: str, old: Manifest | None, *, rank_from: str, skip_bad: bool,
         nccl_tests) -> Plan:
    """Decide, file by file, what this ingest keeps, skips and reads. trace_dir and store_dir are absolute;
    old is the previous manifest (None: read everything). Raises TraceFileError for an unreadable trace
    unless skip_bad."""
    p = Plan(manifest=Manifest(trace_dir=trace_dir))
    for source in discover(trace_dir, store_dir):
        _plan_file(p, trace_dir, source, old, rank_from, skip_bad)
    # nccl-tests references: passed ones are read again; earlier ones are kept as they were
    refs = {NCCL_TESTS_PREFIX + os.path.abspath(given): given for given in nccl_tests}
    p.todo += [Planned(key, "nccl_tests", given) for key, given in sorted(refs.items())]
    if old:
        for key, e in old.sources.items():
            if e.kind == "nccl_tests" and key not in refs:
                p.manifest.sources[key] = e
        planned = {t.source for t in p.todo}
        p.removed = sorted(k for k in set(old.sources) - set(p.manifest.sources) - planned
                           if old.sources[k].kind in REPORTED_KINDS)
    return p


def _plan_file(p: Plan, trace_dir: str, source: str, old: Manifest | None, rank_from: str, skip_bad: bool) -> None:
    path = os.path.join(trace_dir, source)
    why = not_openable(path)
    if why:
        p.unopened[source] = why
        return
    st = os.stat(path)
    prev = old.sources.get(source) if old else None

    def keep(entry) -> None:
        p.manifest.sources[source] = entry
        if entry.kind in REPORTED_KINDS:
            p.unchanged.append(source)

    def read(kind: str, digest: str | None = None) -> None:
        p.todo.append(Planned(source, kind, path, digest or sha256(path), st))

    if prev and prev.size == st.st_size and prev.mtime_ns == st.st_mtime_ns and rank_from == "auto":
        return keep(prev)
    if is_run_manifest(source):
        kind = "run_manifest"
    else:
        if old and source in old.skipped and prev is None and _manifest.skip_matches(old.skipped[source], st):
            p.manifest.skipped[source] = old.skipped[source]
            p.skipped[source] = _manifest.skip_reason(old.skipped[source])
            return
        if path.endswith(INSPECTOR_SUFFIXES) or (not path.endswith(FR_SUFFIXES) and is_inspector_candidate(path)):
            return read("nccl_inspector")  # detected by content: one Inspector record per line
        try:
            # a pickle here can only be a flight-recorder dump
            kind = "flight_recorder" if path.endswith(FR_SUFFIXES) else sniff(path)
        except NotATraceError as e:
            if is_fr_candidate(path):
                return read("flight_recorder")
            p.manifest.skipped[source] = _manifest.skip_entry(st, e.reason)
            p.skipped[source] = e.reason
            return
        except TraceFileError as e:
            if not skip_bad:
                raise
            p.failed[source] = e.reason
            return
    digest = sha256(path)
    if prev and prev.sha256 == digest and rank_from == "auto":
        prev.mtime_ns = st.st_mtime_ns
        return keep(prev)
    read(kind, digest)
