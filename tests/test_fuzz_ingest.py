"""Fuzzing ingest: mutated traces give a valid store or one clear error, never a crash.

Examples per test: FUZZ_EXAMPLES (default 60; a dedicated run uses 10000+).
Inputs that once broke ingest are kept in tests/fuzz/ and replayed every run.
"""
from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import ingest

from .conftest import tiny_events, write_trace

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
CORPUS = Path(__file__).parent / "fuzz"
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
                    suppress_health_check=list(HealthCheck))


def _base_doc() -> dict:
    return {"schemaVersion": 1, "traceEvents": tiny_events(2), "distributedInfo": {"rank": 0, "world_size": 1}}


def check(tmp_path: Path, name: str, data: bytes) -> str:
    """Ingest one file; return 'ok' or 'error'. Anything else fails the test."""
    d = tmp_path / f"case{random.randrange(1 << 30)}"
    d.mkdir()
    (d / name).write_bytes(data)
    store = d / "store"
    try:
        ingest(str(d), str(store), jobs=1, progress=False)
    except TracekitError as e:
        msg = str(e)
        assert "\n" not in msg.strip() and len(msg) < 2000, msg
        assert name in msg or "no Kineto traces" in msg, msg
        # nothing half-written is left visible
        assert not (store / "manifest.json").exists()
        return "error"
    run = tracekit.open(str(store))
    n = run.sql("SELECT count(*) AS n FROM events")["n"][0]
    assert n >= 1
    run.sql("SELECT * FROM kernels")  # the views bind and run
    run.sql("SELECT * FROM steps")
    run.info()
    return "ok"


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from([1e308, -1e308, 9.3e15, -1, 2**63, 2**64, "NaN", "1e400", "", "0x10", " 7"]),
)
_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args"]


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


@pytest.mark.parametrize("case", [
    "deep_nesting", "huge_string", "non_utf8", "int64_overflow_ts", "negative_ts", "unknown_phase",
    "duplicate_keys", "no_events_key", "events_not_list", "top_level_number", "bom", "nul_bytes",
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
    if data is None:
        data = json.dumps(doc).encode()
    out = check(tmp_path, "rank0.json", data)
    if case in ("huge_string", "unknown_phase", "negative_ts", "nul_bytes"):
        assert out == "ok"


def test_corpus(tmp_path):
    """Inputs kept from earlier failures."""
    for f in sorted(CORPUS.glob("*")):
        if f.name.endswith((".json", ".gz")):
            check(tmp_path, "rank0.json.gz" if f.name.endswith(".gz") else "rank0.json", f.read_bytes())
