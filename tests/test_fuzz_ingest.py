"""Fuzzing ingest: mutated traces give a valid store or one clear error, never a crash.

Two kinds of input are mutated: a tiny trace built in code, and real traces (a
bundled sample from sample_traces/ and, when present, hta/critical_path/simple_add
from ../shared/traces). The mutations are plain functions of a seeded RNG
(MUTATIONS below), shared with bench/fuzz.py, which runs 10,000+ of them.

Examples per hypothesis test: FUZZ_EXAMPLES (default 60; a dedicated run uses 10000+).
Inputs that once broke ingest are kept in tests/fuzz/ and replayed every run: a
file (rank0.json / rank0.json.gz) or a directory of files (a multi-file case).
Each case runs under a watchdog (FUZZ_CASE_TIMEOUT seconds, default 120): a hang fails the test.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import ingest

from .conftest import REPO, SHARED_TRACES, has_shared_trace, tiny_events, write_trace

pytestmark = pytest.mark.slow  # fuzz: thousands of mutated traces

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
CASE_TIMEOUT = int(os.environ.get("FUZZ_CASE_TIMEOUT", "120"))
CORPUS = Path(__file__).parent / "fuzz"
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
                    suppress_health_check=list(HealthCheck))


class CaseHang(Exception):
    pass


@contextmanager
def watchdog(seconds: int = CASE_TIMEOUT):
    """Fail a case that runs longer than `seconds` (a hang), instead of stalling the run."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise CaseHang(f"ingest still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _base_doc() -> dict:
    return {"schemaVersion": 1, "traceEvents": tiny_events(2), "distributedInfo": {"rank": 0, "world_size": 1}}


def check_dir(d: Path, names: list[str]) -> str:
    """Ingest the trace directory d holding `names`; return 'ok' or 'error'. Anything else fails:
    a traceback (any non-TracekitError), an internal error, an unclear or unnamed error, a hang,
    or a partial store."""
    store = d / ".store"
    try:
        with watchdog():
            ingest(str(d), str(store), jobs=1, progress=False)
    except TracekitError as e:
        msg = str(e)
        assert "\n" not in msg.strip() and len(msg) < 2000, msg
        assert "internal error" not in msg, msg
        assert any(n in msg for n in names) or "no Kineto traces" in msg, msg
        # nothing half-written is left visible
        assert not (store / "manifest.json").exists()
        assert not (store / "staging").exists()
        return "error"
    run = tracekit.open(str(store))
    n = run.sql("SELECT count(*) AS n FROM events")["n"][0]
    assert n >= 1
    run.sql("SELECT * FROM kernels")  # the views bind and run
    run.sql("SELECT * FROM steps")
    run.info()
    return "ok"


def check(tmp_path: Path, name: str, data: bytes) -> str:
    return check_files(tmp_path, {name: data})


def check_files(tmp_path: Path, files: dict[str, bytes]) -> str:
    d = tmp_path / f"case{random.randrange(1 << 30)}"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return check_dir(d, list(files))


# --- inputs -----------------------------------------------------------------------------------------------

SAMPLE_TRACE = REPO / "sample_traces" / "ddp2_2hosts_100mbit" / "rank0.trace.json.gz"
SIMPLE_ADD = SHARED_TRACES / "hta" / "critical_path" / "simple_add"
_SOURCES: dict[str, bytes] = {}


def source_text(src: str) -> bytes:
    """The decompressed JSON of a source: 'tiny', 'sample' (bundled), 'simple_add' (shared, may be absent)."""
    if src not in _SOURCES:
        if src == "tiny":
            _SOURCES[src] = json.dumps(_base_doc(), indent=1).encode()
        elif src == "sample":
            _SOURCES[src] = gzip.decompress(SAMPLE_TRACE.read_bytes())
        elif src == "simple_add":
            files = sorted(SIMPLE_ADD.glob("*.json.gz")) if SIMPLE_ADD.exists() else []
            if not files:
                raise FileNotFoundError(SIMPLE_ADD)
            _SOURCES[src] = gzip.decompress(files[0].read_bytes())
    return _SOURCES[src]


def available_sources() -> list[str]:
    out = ["tiny", "sample"]
    if has_shared_trace(str(SIMPLE_ADD.relative_to(SHARED_TRACES))):
        out.append("simple_add")
    return out


def _pack(text: bytes, gz: bool) -> tuple[str, bytes]:
    return ("rank0.json.gz", gzip.compress(text, compresslevel=1)) if gz else ("rank0.json", text)


_STRUCT = b'{}[],:"'
_NUM_FIELD = re.compile(rb'"(ts|dur|pid|tid|id|External id|correlation|rank|world_size)": ?(-?[0-9][0-9.eE+-]*)')
_STR_VALUE = re.compile(rb'"(name|cat|ph)": ?"([^"\\]*)"')
_HOSTILE_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"-1", b"-5.5", b"0", b"1e300", b"-1e300", b"1e400",
                    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809",
                    b"18446744073709551616", b"100000000000000000000000000000", b"1e19", b"4.9e-324", b"-0",
                    b"1.7976931348623157e308", b"9.3e15"]


def mut_truncate_structural(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """Cut just before or after a structural byte (class chosen first, then a position of that class)."""
    cls = rng.choice(_STRUCT)
    positions = [m.start() for m in re.finditer(re.escape(bytes([cls])), text)]
    pos = rng.choice(positions) if positions else rng.randrange(len(text))
    cut = pos + rng.choice([0, 1])
    return dict([_pack(text[:cut], rng.random() < 0.3)])


def mut_corrupt_gzip(rng: random.Random, text: bytes) -> dict[str, bytes]:
    data = bytearray(gzip.compress(text, compresslevel=rng.choice([1, 6, 9])))
    mode = rng.choice(["flip_deflate", "bad_crc", "bad_isize", "truncate_member", "trailing_garbage",
                       "second_member_truncated", "bad_header"])
    if mode == "flip_deflate":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(10, len(data) - 8)
            data[i] ^= rng.randrange(1, 256)
    elif mode == "bad_crc":
        crc = struct.unpack("<I", data[-8:-4])[0]
        data[-8:-4] = struct.pack("<I", crc ^ (1 << rng.randrange(32)))
    elif mode == "bad_isize":
        data[-4:] = struct.pack("<I", rng.randrange(1 << 32))
    elif mode == "truncate_member":
        data = data[:rng.randrange(1, len(data))]
    elif mode == "trailing_garbage":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif mode == "second_member_truncated":
        extra = gzip.compress(b' {"ph": "X"}')
        data += extra[:rng.randrange(1, len(extra))]
    else:
        data[rng.randrange(2, 10)] ^= rng.randrange(1, 256)
    return {"rank0.json.gz": bytes(data)}


def mut_hostile_number(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """NaN/Infinity tokens (invalid JSON), negative, huge and int64-overflowing ts, dur, ids, ranks."""
    hits = list(_NUM_FIELD.finditer(text))
    out = text
    for m in sorted(rng.sample(hits, min(len(hits), rng.choice([1, 1, 2, 5]))), key=lambda m: -m.start()):
        out = out[:m.start(2)] + rng.choice(_HOSTILE_NUMBERS) + out[m.end(2):]
    return dict([_pack(out, rng.random() < 0.3)])


def _random_value(rng: random.Random):
    return rng.choice([None, True, False, -1, 0, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 9.3e15, 1.5,
                       "", "NaN", "1e400", "0x10", " 7", "X", "\u2603", [], [1, 2], {}, {"a": 1}, [[[]]],
                       "k" * rng.randrange(1, 200)])


_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args"]
_ARG_FIELDS = ["External id", "correlation", "device", "stream", "Input Dims", "Input type", "Sequence number",
               "Addr", "Bytes", "Total Allocated", "Total Reserved", "cbid", "grid", "block", "bytes",
               "Collective name", "In msg nelems", "Group size", "Process Group Name", "Process Group Ranks",
               "Rank", "dtype", "In split size", "Out split size"]
_TOP_FIELDS = ["schemaVersion", "distributedInfo", "deviceProperties", "baseTimeNanoseconds", "displayTimeUnit",
               "traceName", "traceEvents"]


def mut_wrong_type(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """A wrong type in a field the parser reads: event fields, args fields, top-level fields."""
    doc = json.loads(text)
    evs = doc["traceEvents"]
    where = rng.choice(["event", "event", "args", "top", "distinfo"])
    for _ in range(rng.choice([1, 1, 3])):
        ev = evs[rng.randrange(len(evs))] if evs else {}
        if where == "event":
            ev[rng.choice(_FIELDS)] = _random_value(rng)
        elif where == "args":
            if isinstance(ev.get("args"), dict):
                ev["args"][rng.choice(list(ev["args"]) + _ARG_FIELDS)] = _random_value(rng)
            else:
                ev["args"] = {rng.choice(_ARG_FIELDS): _random_value(rng)}
        elif where == "top":
            doc[rng.choice(_TOP_FIELDS)] = _random_value(rng)
        else:
            info = doc.get("distributedInfo")
            info = info if isinstance(info, dict) else {}
            info[rng.choice(["rank", "world_size", "backend", "pg_config", "nccl_version"])] = _random_value(rng)
            doc["distributedInfo"] = info
    return dict([_pack(json.dumps(doc).encode(), rng.random() < 0.3)])


def mut_unknown_phase_cat(rng: random.Random, text: bytes) -> dict[str, bytes]:
    hits = [m for m in _STR_VALUE.finditer(text) if m.group(1) in (b"ph", b"cat")]
    out = text
    for m in sorted(rng.sample(hits, min(len(hits), rng.choice([1, 3, 20]))), key=lambda m: -m.start()):
        new = rng.choice([b"Z", b"", b"XX", b"kernel2", b"\\u0000", b"gpu_user_annotation", b"b", b"e", b"C",
                          b"ac2g", b"user_annotation", b"cpu_op", b"unknown \\\" cat"])
        out = out[:m.start(2)] + new + out[m.end(2):]
    return dict([_pack(out, rng.random() < 0.3)])


def mut_deep_nesting(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """An event whose args (or name) nest 10..100000 levels deep."""
    depth = rng.choice([10, 100, 1000, 5000, 100000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    nested = opener * depth + b"1" + closer * depth
    hits = [m.start() for m in re.finditer(rb'"args": ?\{', text)]
    if hits:
        i = rng.choice(hits)
        j = text.index(b"{", i) + 1
        out = text[:j] + b'"deep": ' + nested + (b", " if text[j:].lstrip()[:1] != b"}" else b"") + text[j:]
    else:
        out = text.replace(b'"traceEvents": [', b'"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": ' + nested
                           + b"}, ", 1)
    return dict([_pack(out, rng.random() < 0.3)])


def mut_huge_string(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """A 10 MB name / cat / arg string."""
    hits = list(_STR_VALUE.finditer(text))
    m = rng.choice(hits)
    big = rng.choice([b"k", b"\\u00e9", b"ab\\\"c"]) * ((10 << 20) // rng.choice([1, 6, 5]))
    out = text[:m.start(2)] + big + text[m.end(2):]
    return dict([_pack(out, rng.random() < 0.3)])


def mut_non_utf8(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """Bytes that are not UTF-8 inside strings (or anywhere)."""
    bad = [b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"]
    out = bytearray(text)
    hits = list(_STR_VALUE.finditer(text))
    for _ in range(rng.choice([1, 1, 4])):
        if hits and rng.random() < 0.8:
            m = rng.choice(hits)
            i = rng.randint(m.start(2), m.end(2))
        else:
            i = rng.randrange(len(out))
        out[i:i] = rng.choice(bad)
        hits = list(_STR_VALUE.finditer(bytes(out))) if hits else hits
    return dict([_pack(bytes(out), rng.random() < 0.3)])


def mut_byte_flip(rng: random.Random, text: bytes) -> dict[str, bytes]:
    gz = rng.random() < 0.3
    data = bytearray(gzip.compress(text, compresslevel=1) if gz else text)
    for _ in range(rng.choice([1, 2, 8])):
        i = rng.randrange(len(data))
        mode = rng.choice(["flip", "insert", "delete", "replace"])
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        if mode == "flip":
            data[i] ^= junk[0] or 1
        elif mode == "insert":
            data[i:i] = junk
        elif mode == "delete":
            del data[i:i + len(junk)]
        else:
            data[i:i + len(junk)] = junk
    return {"rank0.json.gz" if gz else "rank0.json": bytes(data)}


def _with_info(text: bytes, info) -> bytes:
    doc = json.loads(text)
    if info is None:
        doc.pop("distributedInfo", None)
    else:
        doc["distributedInfo"] = info
    return json.dumps(doc).encode()


def mut_ranks(rng: random.Random, text: bytes) -> dict[str, bytes]:
    """Duplicate and missing ranks across files: two files claiming one rank, gaps, out-of-range, no rank."""
    mode = rng.choice(["duplicate", "missing", "out_of_range", "absent_one", "absent_all", "negative"])
    n = rng.choice([2, 3])
    ranks: list = {"duplicate": [0] * n, "missing": [0, 2, 5][:n], "out_of_range": [0, 7, 9][:n],
                   "absent_one": [0, None, 2][:n], "absent_all": [None] * n, "negative": [0, -1, -2][:n]}[mode]
    world = rng.choice([n, 1, 4, 0])
    names = rng.choice([[f"rank{i}.json" for i in range(n)], [f"rank0_{i}.json" for i in range(n)],
                        [f"worker{i}.json" for i in range(n)]])
    files = {}
    for name, r in zip(names, ranks):
        info = None if r is None else {"backend": "nccl", "rank": r, "world_size": world}
        files[name] = _with_info(text, info)
    return files


MUTATIONS = {
    "truncate_structural": mut_truncate_structural, "corrupt_gzip": mut_corrupt_gzip,
    "hostile_number": mut_hostile_number, "wrong_type": mut_wrong_type, "unknown_phase_cat": mut_unknown_phase_cat,
    "deep_nesting": mut_deep_nesting, "huge_string": mut_huge_string, "non_utf8": mut_non_utf8,
    "byte_flip": mut_byte_flip, "ranks": mut_ranks,
}


def make_case(seed, i: int, sources: list[str] | None = None) -> tuple[str, str, dict[str, bytes]]:
    """Case i of a seeded run: (mutation, source, files). Deterministic in (seed, i)."""
    rng = random.Random(f"{seed}:{i}")
    sources = sources or available_sources()
    kind = list(MUTATIONS)[i % len(MUTATIONS)]
    # the 10 MB strings and the 1.9 MB real sample cost 10-30x a small case: about 1 case in 100 each
    if kind == "huge_string" and rng.random() < 0.9:
        kind = rng.choice([k for k in MUTATIONS if k != "huge_string"])
    src = rng.choice([s for s in sources if s != "sample"]) if rng.random() < 0.99 else "sample"
    return kind, src, MUTATIONS[kind](rng, source_text(src))


def save_to_corpus(files: dict[str, bytes], label: str) -> Path:
    """Keep an input that failed: tests/fuzz/<label>/ holds its files and is replayed by test_corpus."""
    d = CORPUS / re.sub(r"[^A-Za-z0-9_.-]", "_", label)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


# --- hypothesis tests on the tiny trace (field-level) -------------------------------------------------------

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from([1e308, -1e308, 9.3e15, -1, 2**63, 2**64, "NaN", "1e400", "", "0x10", " 7"]),
)


@SETTINGS
@given(field=st.sampled_from(_FIELDS), value=_VALUES, index=st.integers(0, 200), gz=st.booleans())
def test_wrong_types_in_fields(tmp_path_factory, field, value, index, gz):
    doc = _base_doc()
    ev = doc["traceEvents"][index % len(doc["traceEvents"])]
    ev[field] = value
    data = json.dumps(doc).encode()
    check(tmp_path_factory.mktemp("f"), "rank0.json.gz" if gz else "rank0.json", gzip.compress(data) if gz else data)


@SETTINGS
@given(cut=st.floats(0, 1), gz=st.booleans())
def test_truncation_anywhere(tmp_path_factory, cut, gz):
    data = json.dumps(_base_doc(), indent=2).encode()
    if gz:
        data = gzip.compress(data)
    data = data[: int(len(data) * cut)]
    check(tmp_path_factory.mktemp("t"), "rank0.json.gz" if gz else "rank0.json", data)


@SETTINGS
@given(pos=st.floats(0, 1), junk=st.binary(min_size=1, max_size=8), mode=st.sampled_from(["flip", "insert", "replace"]),
       gz=st.booleans())
def test_byte_mutations(tmp_path_factory, pos, junk, mode, gz):
    data = bytearray(json.dumps(_base_doc(), indent=1).encode())
    if gz:
        data = bytearray(gzip.compress(bytes(data)))
    i = int(pos * (len(data) - 1))
    if mode == "flip":
        data[i] ^= junk[0] or 1
    elif mode == "insert":
        data[i:i] = junk
    else:
        data[i:i + len(junk)] = junk
    check(tmp_path_factory.mktemp("b"), "rank0.json.gz" if gz else "rank0.json", bytes(data))


# --- seeded mutations of real and tiny traces (the same generator bench/fuzz.py runs at 10,000+) -----------

@SETTINGS
@given(kind=st.sampled_from(sorted(MUTATIONS)), seed=st.integers(0, 2**32 - 1),
       src=st.sampled_from(["tiny", "sample", "simple_add"]))
def test_mutations_of_real_traces(tmp_path_factory, kind, seed, src):
    if src not in available_sources():
        src = "sample"
    if kind == "huge_string" and src == "sample":
        src = "tiny"  # 10 MB on top of the 1.9 MB sample: slow for CI, covered by bench/fuzz.py
    rng = random.Random(seed)
    files = MUTATIONS[kind](rng, source_text(src))
    check_files(tmp_path_factory.mktemp("m"), files)


@pytest.mark.parametrize("cls", list(_STRUCT.decode()))
def test_truncation_at_every_structural_class(tmp_path, cls):
    """A real trace cut right after a byte of each structural class: salvaged or refused, and a cut
    well into the file keeps events and reports the lost ones."""
    src = "simple_add" if "simple_add" in available_sources() else "sample"
    text = source_text(src)
    positions = [m.start() for m in re.finditer(re.escape(cls.encode()), text)]
    rng = random.Random(cls)
    for pos in rng.sample(positions, 3):
        out = check(tmp_path, "rank0.json", text[:pos + 1])
        if pos > len(text) // 2:
            assert out == "ok"  # half of a real trace always has complete events to keep


@pytest.mark.parametrize("case", [
    "deep_nesting", "huge_string", "non_utf8", "int64_overflow_ts", "negative_ts", "unknown_phase",
    "duplicate_keys", "no_events_key", "events_not_list", "top_level_number", "bom", "nul_bytes",
    "nan_token", "infinity_token",
])
def test_hostile_shapes(tmp_path, case):
    doc = _base_doc()
    ev = doc["traceEvents"]
    data = None
    if case == "deep_nesting":
        data = (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": ' + b'[' * 5000 + b']' * 5000 + b'}]}')
    elif case == "huge_string":
        ev[3]["name"] = "k" * (10 << 20)
    elif case == "non_utf8":
        data = json.dumps(doc).encode().replace(b"gemm_kernel", b"gemm_\xff\xfe_kernel")
    elif case == "int64_overflow_ts":
        ev[3]["ts"] = 2**63
    elif case == "negative_ts":
        ev[3]["ts"] = -5.5
        ev[3]["dur"] = -3
    elif case == "unknown_phase":
        ev.append({"ph": "Z", "cat": "weird", "name": "q", "pid": 1, "tid": 1, "ts": 5})
    elif case == "duplicate_keys":
        data = json.dumps(doc).encode().replace(b'"ph": "X"', b'"ph": "X", "ph": "i"', 1)
    elif case == "no_events_key":
        data = b'{"schemaVersion": 1, "distributedInfo": {"rank": 0}}'
    elif case == "events_not_list":
        data = b'{"traceEvents": {"ph": "X"}}'
    elif case == "top_level_number":
        data = b"12345"
    elif case == "bom":
        data = b"\xef\xbb\xbf" + json.dumps(doc).encode()
    elif case == "nul_bytes":
        data = json.dumps(doc).encode().replace(b"aten::mm", b"aten\\u0000mm")
    elif case == "nan_token":
        data = json.dumps(doc).encode().replace(b'"dur": 30', b'"dur": NaN', 1)
    elif case == "infinity_token":
        data = json.dumps(doc).encode().replace(b'"ts": 1020', b'"ts": -Infinity', 1)
    if data is None:
        data = json.dumps(doc).encode()
    out = check(tmp_path, "rank0.json", data)
    if case in ("huge_string", "unknown_phase", "negative_ts", "nul_bytes"):
        assert out == "ok"


def test_duplicate_and_missing_ranks(tmp_path):
    """Two files claiming rank 0 are refused naming a file; ranks 0 and 2 of 3 ingest as exactly those."""
    d = tmp_path / "dup"
    write_trace(d / "a.json", tiny_events(), rank=0, world_size=2)
    write_trace(d / "b.json", tiny_events(), rank=0, world_size=2)
    with pytest.raises(TracekitError) as e:
        ingest(str(d), str(d / ".store"), jobs=1, progress=False)
    assert "a.json" in str(e.value) or "b.json" in str(e.value)
    assert not (d / ".store" / "manifest.json").exists()
    d = tmp_path / "gap"
    write_trace(d / "r0.json", tiny_events(), rank=0, world_size=3)
    write_trace(d / "r2.json", tiny_events(), rank=2, world_size=3)
    assert check_dir(d, ["r0.json", "r2.json"]) == "ok"
    assert tracekit.open(str(d / ".store")).ranks == [0, 2]


def test_corpus(tmp_path):
    """Inputs kept from earlier failures: single files, and directories of files (multi-file cases)."""
    entries = sorted(CORPUS.glob("*"))
    for f in entries:
        if f.is_dir():
            files = {p.name: p.read_bytes() for p in sorted(f.iterdir()) if p.name.endswith((".json", ".gz"))}
            if files:
                check_files(tmp_path, files)
        elif f.name.endswith((".json", ".gz")):
            check(tmp_path, "rank0.json.gz" if f.name.endswith(".gz") else "rank0.json", f.read_bytes())
