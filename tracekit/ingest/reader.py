"""Streaming reader for Chrome/Kineto trace JSON (plain or gzip).

Owns: decompression, finding the `traceEvents` array, cutting it into batches of
complete events without holding the whole file, the metadata around the array,
and salvaging what a profiler killed mid-write left behind.

Why not one `json.loads`: a multi-GB trace must ingest in bounded memory, and a
truncated file must still give up every complete event. Cuts are found with a
cheap byte search (`}` `,` `{`) and confirmed by the decoder: a prefix that
starts at an event boundary and decodes as a list of complete values can only end
at an event boundary, so a wrong candidate simply fails to decode and an earlier
one is tried.
"""
from __future__ import annotations

import bisect
import os
import re
import zlib

try:  # ISA-L inflates gzip about 3x faster than zlib; same interface and errors
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - platforms without an isal wheel
    _inflate = zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec

from ..errors import NotATraceError, TraceFileError

CHUNK_BYTES = 5 << 19  # decompressed bytes per batch: peak memory scales with it (2.5 MB: 3 MB went over 3x the file)
_READ_BYTES = 1 << 20
_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"
_MAX_CUT_TRIES = 64
_SPLIT = msgspec.json.Decoder(list[msgspec.Raw])


def _decode_error(exc: Exception) -> bool:
    """True for syntax errors (a wrong cut), False for type errors (bad data)."""
    return isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError)


_MALFORMED = re.compile(r"JSON is malformed: (.*) \(byte (\d+)\)")
# A \u escape of a UTF-16 surrogate (D800-DFFF); _ESCAPE reads every escape in order, so that an escaped
# backslash before "ud800" is not taken for one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_REPLACEMENT_ESCAPE = b"\\ufffd"  # U+FFFD, as long as the escape it replaces


def _lone_surrogates(text: bytes | memoryview) -> list[int]:
    """The offsets of the \\u escapes in text that are half of a UTF-16 surrogate pair without the other
    half: valid JSON syntax but no character, which msgspec and DuckDB refuse ("unexpected end of hex
    escape"). Empty for text without one (one regular-expression search)."""
    if not _SURROGATE_ESCAPE.search(text):
        return []
    lone: list[int] = []
    high = None  # (start, end) of a high surrogate escape waiting for its low half
    for m in _ESCAPE.finditer(text):
        cp = int(m.group(1), 16) if m.group(1) else None
        if high is not None:
            if cp is not None and 0xDC00 <= cp <= 0xDFFF and m.start() == high[1]:
                high = None  # a pair: one character
                continue
            lone.append(high[0])
            high = None
        if cp is not None and 0xD800 <= cp <= 0xDBFF:
            high = (m.start(), m.end())
        elif cp is not None and 0xDC00 <= cp <= 0xDFFF:
            lone.append(m.start())
    if high is not None:
        lone.append(high[0])
    return lone


def _replace_lone_surrogates(text: bytes | memoryview) -> tuple[bytes | memoryview, list[int]]:
    """text with each lone surrogate escape replaced by U+FFFD's (the same length), and their offsets; text
    itself, not a copy, when it has none (a run that failed to decode for another reason)."""
    lone = _lone_surrogates(text)
    if not lone:
        return text, lone
    out = bytearray(text)
    for at in lone:
        out[at:at + len(_REPLACEMENT_ESCAPE)] = _REPLACEMENT_ESCAPE
    return bytes(out), lone


class Batch(NamedTuple):
    """One run of consecutive complete events, as TraceStream.batches yields it."""

    text: bytes | None  # the events as a JSON array (checked to be complete, valid JSON); None when decoded
    first: int  # the index of its first event in traceEvents
    n: int  # its number of events
    decoded: Any  # what the stream's decoder made of it (a Run of _events), or None


class _Broken(Exception):
    """The file's own bytes are not JSON before the end of a candidate run: no cut can mend that.

    A wrong cut fails at the run's last byte (the "]" added after it) or as truncated input; the run
    before the cut is the file's bytes unchanged, so an error inside them is an error of the file."""


class TraceStream:
    """Iterate decoded batches of events from one trace file.

    After iteration: `metadata` holds every top-level key except traceEvents,
    `event_count` the events yielded, `lost_events` the incomplete events a
    truncated file lost, `warnings` human-readable notes.

    decoder(events, first_id, head_metadata) -> a decoded run (with `.rows`) or None: called first on each
    candidate run, given as its comma-separated events without the array's brackets (a view of the read
    buffer, not a copy).
    A run it takes is complete, valid JSON (it parses all of it), so the cheaper of the two checks
    is skipped and the run is handed on decoded; on None the run is checked as JSON as without it.
    """

    def __init__(self, path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES,
                 decoder: Callable[[bytes, int, dict], Any] | None = None):
        self.path = os.fspath(path)
        self.chunk_bytes = chunk_bytes
        self._decoder = decoder
        self.metadata: dict[str, Any] = {}
        self.head_metadata: dict[str, Any] = {}
        self.event_count = 0
        self.lost_events = 0
        self.truncated = False
        self.broken: str | None = None  # where traceEvents stops being JSON
        self.warnings: list[str] = []
        self._replaced: list[int] = []  # events in which a lone surrogate escape was replaced (_run)

    # -- bytes --------------------------------------------------------------
    def _blocks(self) -> Iterator[bytes]:
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise TraceFileError(self.path, f"cannot read the file ({e.strerror})") from None
        with f:
            magic = f.read(2)
            f.seek(0)
            if magic != b"\x1f\x8b":
                while block := f.read(_READ_BYTES):
                    yield block
                return
            d = _inflate.decompressobj(31)
            while True:
                block = f.read(_READ_BYTES)
                if not block:
                    break
                while block:
                    try:
                        # bounded output: a 1 MB gzip block can hold 50 MB of JSON
                        out = d.decompress(block, _READ_BYTES)
                    except (zlib.error, _inflate.error) as e:
                        raise TraceFileError(
                            self.path,
                            f"gzip data is corrupt ({e}); copy the file again or re-export the trace",
                        ) from None
                    if out:
                        yield out
                    if d.eof:  # multi-member gzip: start the next member
                        block = d.unused_data
                        if block.strip(b"\x00"):
                            d = _inflate.decompressobj(31)
                        else:
                            block = b""
                    else:
                        block = d.unconsumed_tail
            if not d.eof:
                tail = d.flush()
                if tail:
                    yield tail
                self.truncated = True
                self.warnings.append("gzip stream ends early (file cut short)")

    # -- events -------------------------------------------------------------
    def batches(self) -> Iterator[Batch]:
        """Yield the runs of consecutive complete events: each as a JSON array (Batch.text), or as what the
        decoder made of it (Batch.decoded)."""
        yield from self._batches()
        if self._replaced:
            more = f" and {len(self._replaced) - 1} more event(s)" if len(self._replaced) > 1 else ""
            self.warnings.append(
                f"traceEvents[{self._replaced[0]}]{more}: a string held a lone UTF-16 surrogate escape (such as "
                "\\ud800, half of a pair: no character); kept the event with U+FFFD in its place")

    def _batches(self) -> Iterator[Batch]:
        decode = _SPLIT.decode
        blocks = self._blocks()
        buf = b""
        eof = False
        dropped = 0  # bytes of the (decompressed) file before buf

        def fill(min_len: int) -> None:
            nonlocal buf, eof
            parts = [buf]
            size = len(buf)
            while size < min_len and not eof:
                try:
                    b = next(blocks)
                except StopIteration:
                    eof = True
                    break
                parts.append(b)
                size += len(b)
            buf = b"".join(parts)

        # head: everything before the events array
        fill(1 << 16)
        start = len(buf) - len(buf.lstrip(_WS))
        if not buf[start:]:
            raise TraceFileError(self.path, "the file is empty")
        first = buf[start:start + 1]
        if first not in (b"{", b"["):
            raise TraceFileError(self.path, "not JSON (expected a trace object or event array)")
        if first == b"[":
            pos = start + 1
            array_format = True
        else:
            array_format = False
            while True:
                m = _TRACE_EVENTS.search(buf)
                if m or eof:
                    break
                fill(len(buf) * 2)
            if not m:
                self._no_events_array(buf)
            self.head_metadata = self._decode_object(buf[start:m.start()].rstrip(_WS).rstrip(b","), "metadata before traceEvents")
            self.metadata.update(self.head_metadata)
            pos = m.end()

        try:
            while True:
                if not eof:
                    fill(len(buf) - pos + self.chunk_bytes)
                if eof:
                    break
                # as many chunk-sized runs as the buffer holds, then read more
                while len(buf) - pos >= self.chunk_bytes:
                    cut = self._cut(buf, pos, decode, pos + self.chunk_bytes) or self._cut(buf, pos, decode)
                    if cut is None:  # one event larger than what we hold: read more
                        fill(len(buf) + self.chunk_bytes)
                        if eof:
                            break
                        continue
                    events, pos = cut
                    yield events
                dropped += pos
                buf = buf[pos:]
                pos = 0

            # end of file: cut whole batches, then find the array's end or salvage
            while len(buf) - pos > self.chunk_bytes:
                cut = self._cut(buf, pos, decode, pos + self.chunk_bytes) or self._cut(buf, pos, decode)
                if cut is None:
                    break
                events, pos = cut
                yield events
            rest = buf[pos:]
            yield from self._finish(rest, decode, array_format)
        except _Broken:
            yield from self._salvage_broken(buf, pos, dropped, decode, blocks)

    def _decode_object(self, text: bytes, what: str) -> dict:
        try:
            obj = msgspec.json.decode(text + b"}")
        except msgspec.DecodeError:
            raise TraceFileError(self.path, f"{what} is not valid JSON") from None
        if not isinstance(obj, dict):
            raise TraceFileError(self.path, f"{what} is not a JSON object")
        return obj

    def _no_events_array(self, buf: bytes) -> None:
        try:
            msgspec.json.decode(buf)
        except msgspec.DecodeError as e:
            raise TraceFileError(self.path, f"not valid JSON ({e})") from None
        raise NotATraceError(self.path, "valid JSON but has no traceEvents array (not a Kineto trace)")

    def _run(self, decode: Callable[[bytes], list], segment: bytes | memoryview) -> Batch:
        """The run `segment` (events without the array's brackets) as a Batch. A run that neither the decoder
        nor the JSON check takes is tried once more with its lone surrogate escapes replaced, when it has
        some: both readers then take it (they refuse the escape, not the event)."""
        try:
            return self._checked_run(decode, segment)
        except (msgspec.DecodeError, _Broken):
            repaired, lone = _replace_lone_surrogates(segment)
            if not lone:
                raise
            first = self.event_count
            batch = self._checked_run(decode, repaired)
            # which events held them: the events' offsets in the run (a rare path: one more decode)
            starts, at = [], 0
            for raw in _SPLIT.decode(b"[" + repaired + b"]"):
                r = bytes(raw)
                at = repaired.index(r, at)
                starts.append(at)
                at += len(r)
            self._replaced.extend(sorted({first + bisect.bisect_right(starts, o) - 1 for o in lone}))
            return batch

    def _checked_run(self, decode: Callable[[bytes], list], segment: bytes | memoryview) -> Batch:
        first = self.event_count
        decoded = self._decoder(segment, first, self.head_metadata) if self._decoder is not None else None
        if decoded is not None:
            self.event_count += decoded.rows
            return Batch(None, first, decoded.rows, decoded)
        text = b"[" + segment + b"]"
        try:
            n = len(decode(text))
        except msgspec.ValidationError as e:
            raise TraceFileError(self.path, self._where(str(e))) from None
        except msgspec.DecodeError as e:
            m = _MALFORMED.match(str(e))
            if m and int(m.group(2)) < len(text) - 1:
                raise _Broken from None
            raise
        self.event_count += n
        return Batch(text, first, n, None)

    def _where(self, msg: str) -> str:
        m = re.search(r"`\$\[(\d+)\]([^`]*)`", msg)
        if not m:
            return f"an event has a field of the wrong type ({msg})"
        index = self.event_count + int(m.group(1))
        field = m.group(2).lstrip(".") or "the event"
        what = msg.split(" - at ")[0]
        return f"traceEvents[{index}] field '{field}': {what}; fix or drop that event"

    def _cut(self, buf: bytes, pos: int, decode, limit: int | None = None) -> tuple[Batch, int] | None:
        """Decode the longest run of complete events starting at pos that ends
        at the last `},{` boundary before limit; return (events, start of next event)."""
        hi = len(buf) if limit is None else min(limit, len(buf))
        for _ in range(_MAX_CUT_TRIES):
            j = buf.rfind(b"}", pos, hi)
            if j < 0:
                return None
            k = j + 1
            while k < len(buf) and buf[k] in _WS:
                k += 1
            if k < len(buf) and buf[k] == 0x2C:  # ','
                k += 1
                while k < len(buf) and buf[k] in _WS:
                    k += 1
                if k < len(buf) and buf[k] == 0x7B:  # '{'
                    try:
                        with memoryview(buf) as view:  # no copy of the run for the decoder
                            return self._run(decode, view[pos:j + 1]), k
                    except msgspec.DecodeError as e:
                        if not _decode_error(e):
                            raise
            hi = j
        return None

    def _finish(self, rest: bytes, decode, array_format: bool) -> Iterator[Batch]:
        # complete file: the array's closing bracket followed by valid metadata
        hi = len(rest)
        tries = 0
        while tries < _MAX_CUT_TRIES:
            q = rest.rfind(b"]", 0, hi)
            if q < 0:
                break
            hi = q
            tail = rest[q + 1:].strip(_WS)
            if array_format:
                ok, tail_meta = tail == b"", {}
            elif tail == b"}":
                ok, tail_meta = True, {}
            elif tail.startswith(b","):
                try:
                    tail_meta = msgspec.json.decode(b"{" + tail[1:])
                    ok = isinstance(tail_meta, dict)
                except msgspec.DecodeError:
                    ok = False
            else:
                ok = False
            if not ok:
                continue
            tries += 1
            segment = rest[:q].strip(_WS)
            try:
                events = self._run(decode, segment) if segment else Batch(b"[]", self.event_count, 0, None)
            except msgspec.DecodeError as e:
                if not _decode_error(e):
                    raise
                continue
            for key, value in tail_meta.items():
                self.metadata.setdefault(key, value)
            if events.n:
                yield events
            return
        yield from self._salvage(rest, decode, array_format)

    def _salvage(self, rest: bytes, decode, array_format: bool) -> Iterator[Batch]:
        """The array never closes: keep every complete event, count the rest."""
        self.truncated = True
        hi = len(rest)
        for _ in range(_MAX_CUT_TRIES * 4):
            j = rest.rfind(b"}", 0, hi)
            if j < 0:
                break
            hi = j
            try:
                events = self._run(decode, rest[:j + 1])
            except msgspec.DecodeError as e:
                if not _decode_error(e):
                    raise
                continue
            self._lost(rest[j + 1:], array_format)
            if events.n:
                yield events
            return
        self._lost(rest, array_format)

    def _salvage_broken(self, buf: bytes, pos: int, dropped: int, decode, blocks) -> Iterator[Batch]:
        """traceEvents is not JSON somewhere in buf[pos:]: keep every complete event before that byte,
        count the events after it, and say where the file is broken."""
        try:
            decode(b"[" + _replace_lone_surrogates(buf[pos:])[0])  # where the file is broken, not a lone escape
            m = None
        except msgspec.DecodeError as e:
            m = _MALFORMED.match(str(e))
        at = pos + int(m.group(2)) - 1 if m else len(buf)  # the broken byte in buf
        hi, kept_to = at, pos
        for _ in range(_MAX_CUT_TRIES * 4):
            j = buf.rfind(b"}", pos, hi)
            if j < 0:
                break
            hi = j
            try:
                events = self._run(decode, buf[pos:j + 1])
            except msgspec.DecodeError as e:
                if not _decode_error(e):
                    raise
                continue
            kept_to = j + 1
            if events.n:
                yield events
            break
        # the events from the broken one on are lost: count their phases (a cheap byte count)
        self.lost_events = max(1, buf.count(b'"ph"', kept_to) + sum(b.count(b'"ph"') for b in blocks))
        gz = "decompressed " if self.path.endswith(".gz") else ""
        self.broken = (f"traceEvents[{self.event_count}] is not valid JSON at byte {dropped + at} of the {gz}file "
                       f"({m.group(1) if m else 'malformed'})")
        self.warnings.append(f"{self.broken}: kept the {self.event_count} events before it, lost {self.lost_events} "
                             "event(s) from there on and any metadata after traceEvents; fix or drop that event")

    def _lost(self, tail: bytes, array_format: bool) -> None:
        tail = tail.strip(_WS + b",")
        if array_format and not tail:
            self.truncated = False  # the Chrome array format may omit its "]"
            return
        self.lost_events = max(1, tail.count(b'"ph"')) if tail else 0
        self.warnings.append(
            f"file cut short: kept {self.event_count} complete events, lost {self.lost_events} "
            "incomplete event(s) and any metadata after traceEvents"
        )
