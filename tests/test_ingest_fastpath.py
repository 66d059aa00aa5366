"""The compiled events decoder (tracekit/ingest/_events.c) gives exactly the general path's columns.

Ingest converts each run of events with the decoder and takes the general path (DuckDB's read_json and
the typed SQL) for the runs it declines. Both must give the same store: checked here event by event on
hand-written and generated runs, and table by table on every bundled sample and shared trace.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.ingest import ingest, kineto
from tracekit.ingest.reader import TraceStream

from .conftest import REPO, shared_trace_dir

CI = os.environ.get("CI", "").lower() in ("true", "1")


@pytest.fixture(autouse=True)
def _decoder():
    if kineto._events is None:
        if CI:
            pytest.fail("tracekit/ingest/_events.c was not built: CI must build the decoder (setup.py)")
        pytest.skip("the compiled events decoder is not built (pip install -e . with a C compiler builds it)")


def _rows(con, path) -> list[tuple]:
    return con.execute(f"SELECT * FROM read_parquet('{path}') ORDER BY event_id").fetchall()


def _types(con, path) -> list[tuple]:
    return con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()


def both(text: bytes, first_id: int = 0, base: int = 0):
    """(the general path's rows, or its DuckDB error; the decoder's rows, or None where it declines)."""
    with tempfile.TemporaryDirectory() as d:
        scratch = os.path.join(d, "run.json")
        with open(scratch, "wb") as f:
            f.write(text)
        con = kineto._connect()
        params = {"path": scratch, "first_id": first_id, "base": base, "max_object": kineto._MAX_OBJECT}
        general_file, fast_file = os.path.join(d, "general.parquet"), os.path.join(d, "fast.parquet")
        try:
            kineto._write_events(con, params, text, general_file)
            general = _rows(con, general_file)
        except (duckdb.Error, UnicodeDecodeError) as e:  # the latter: DuckDB's message cut a character
            general = e
        run = kineto._events.decode(text, first_id, base)
        # the reader hands over the events without the brackets (a view of its buffer): the same run
        inside = text.strip()[1:-1] if text.strip()[:1] == b"[" and text.strip()[-1:] == b"]" else None
        bare = kineto._events.decode(memoryview(inside), first_id, base, True) if inside is not None else None
        assert (bare is None) == (run is None) or inside is None
        fast = None
        if run is not None:
            kineto._write_decoded(con, run, fast_file)
            fast = _rows(con, fast_file)
            if bare is not None:
                bare_file = os.path.join(d, "bare.parquet")
                assert kineto._write_decoded(con, bare, bare_file) == (run.rows,) + run.checks
                assert _rows(con, bare_file) == fast
            if not isinstance(general, Exception):
                assert _types(con, fast_file) == _types(con, general_file)
                _same_checks(con, run, general_file)
        con.close()
    return general, fast


def _same_checks(con, run, part: str) -> None:
    """What the decoder gathers for ingest's checks (kineto._run_checks) is what SQL gives on the general path's
    part; a part holding collective args is never missed."""
    n, first, last, bad, over, comm = con.execute(
        f"""SELECT count(*), min(ts_ns) FILTER (WHERE fits), max(e) FILTER (WHERE fits),
                   min(event_id) FILTER (WHERE ph = 'X' AND (ts_ns IS NULL OR dur_ns IS NULL)),
                   min(event_id) FILTER (WHERE NOT fits), count(*) FILTER (WHERE {kineto._COMM_ARGS})
            FROM (SELECT *, e BETWEEN {-(1 << 63)} AND {(1 << 63) - 1} AS fits
                  FROM (SELECT *, ts_ns::HUGEINT + coalesce(dur_ns, 0) AS e FROM read_parquet('{part}')))""").fetchall()[0]
    got_first, got_last, got_bad, got_comm, got_over = run.checks
    assert (run.rows, got_first, got_last, got_bad, got_over) == (n, first, last, bad, over)
    assert got_comm or not comm


def agree(text: bytes, **kw) -> bool:
    """Both paths agree; True when the decoder took the run."""
    general, fast = both(text, **kw)
    if isinstance(general, Exception):
        assert fast is None, f"the general path refuses this run ({general}), the decoder took it"
        return False
    if fast is not None:
        assert fast == general
    return fast is not None


def run_of(*events: str) -> bytes:
    return ("[\n" + ",\n".join(events) + "\n]").encode()


TAKEN = [  # runs the decoder must take (and match)
    '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 8, "ts": 1669783687464181, "dur": 45,'
    ' "args": {"External id": 3073, "Ev Idx": 0, "Fwd thread id": 1, "Sequence number": 1573,'
    ' "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "c10::Half"], "Input Strides": [[3, 1], []],'
    ' "Concrete Inputs": ["", "1"], "Record function id": 12}}',
    '{"ph": "X", "cat": "kernel", "name": "void k<\\"x\\">(float*)", "pid": 0, "tid": 7, "ts": 12.5, "dur": 3.25,'
    ' "args": {"device": 0, "stream": 7, "correlation": 99, "blocks per SM": 0.5, "warps per SM": 26.214400000000001,'
    ' "memory bandwidth (GB/s)": 0.08888888888888889, "grid": [1, 1, 1], "shared memory": 0, "queued": 0}}',
    '{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "GPU 0", "External id": 5}}',
    '{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5, "s": "t",'
    ' "args": {"Addr": 140000000000000, "Bytes": -512, "Total Allocated": 1024, "Device Id": 0, "External id": 3}}',
    '{"ph": "s", "id": 42, "pid": 1, "tid": 2, "ts": 1.0, "cat": "ac2g", "name": "ac2g"}',
    '{"ph": "f", "id": "0x2a", "pid": "Spans", "tid": "12", "ts": 1.001, "cat": "ac2g", "name": "ac2g", "bp": "e"}',
    '{"ph": "X", "name": "no ph on the others", "pid": -3, "tid": 0, "ts": 0.0001, "dur": 1e3}',
    '{"name": "no ph: no common args", "ts": 1, "args": {"External id": 9}}',
    '{"ph": "X", "name": "caf\\u00e9 \\ud83d\\ude00 \\/ \\n\\t\\u0001 \\u001f", "ts": -3.25, "dur": 0, "args":'
    ' {"s": "\\u00e9\\/\\"\\\\ \\b\\f\\r \\u2028", "nums": [1.50, 1E2, -0.0, 0.0, 1e21, 1e-7, 0.000001, 5e-324,'
    ' 1.7976931348623157e308, 123456789012345.5, 12345678901234567890123, -0, 100.10, 0.30000000000000004],'
    ' "nested": {"a": [{"b": [true, false, null]}], "e": {}}, "dup": 1, "dup": 2}}',
    '{"ph": "X", "name": "odd common args", "ts": 2, "dur": 1, "args": {"stream": "0x0", "correlation": 1.5,'
    ' "device": true, "cbid": 9223372036854775808, "Ev Idx": "12", "Input Dims": "not a list", "Input type": 3}}',
    '{"ph": "X", "name": "nulls", "ts": null, "dur": null, "pid": null, "id": null, "args": null}',
    '{"ph": "X", "name": "empty args", "ts": 3, "dur": 1, "args": {}, "tts": 5, "cname": "good", "unknown": [1, {"ts": 2}]}',
    '{"ph": "X", "name": "record_param_comms", "ts": 4, "args": {"Collective name": "all_reduce", "Process Group Name": "0"}}',
    '{"ph": "X", "name": "span beyond int64", "ts": 5000000000000000, "dur": 4000000000000000}',
]


@pytest.mark.parametrize("event", TAKEN, ids=range(len(TAKEN)))
def test_decoder_takes_and_matches(event):
    assert agree(run_of(event, TAKEN[0]), first_id=100, base=1_700_000_000_000_000_000)


@pytest.mark.parametrize("ts", ["4203669604595.407", "4203669604595", "-1.5", "1.25e2"])
def test_large_fractional_timestamps_read_exactly(ts):
    # a ts of 13+ integer digits with a fraction: the general path reads the run's ts as exact decimals
    text = run_of('{"ph": "X", "name": "a", "ts": 4203669603438.301, "dur": 60.204}',
                  f'{{"ph": "X", "name": "b", "ts": {ts}, "dur": 1}}')
    assert agree(text) == ("e" not in ts)


@pytest.mark.parametrize("ts, taken", [("1712195495519689.047", True), ("1712195495519689", True),
                                       ("9234567890123.5", True), ("1712195495519689.0476", True),
                                       ("-1712195495519689.000501", True), ("99999999999999999.5", True),
                                       ("1712195495519689.0475", False)])  # a tie at the ns: DuckDB's rounding
def test_timestamps_that_need_their_text(ts, taken):
    text = run_of('{"ph": "X", "name": "a", "ts": 1712195495519689.047, "dur": 63.813}',
                  f'{{"ph": "X", "name": "b", "ts": {ts}, "dur": 1}}', '{"ph": "i", "name": "no ts"}')
    assert agree(text) == taken


DECLINED = [  # the general path's own business: refused events, DuckDB's casts of text
    '{"ph": "X", "name": "a", "name": "b"}',  # repeated key: an error naming the event
    '5',  # not an object
    '{"ph": "X", "ts": "12"}',  # ts as text: DuckDB casts it
    '{"ph": "X", "pid": 1.5}',  # a float pid: its text is the label there
    '{"ph": "X", "pid": true}',
    '{"ph": 1}',  # a number read as text
    '{"ph": "X", "args": "s"}',  # args that are not an object
    '{"ph": "X", "n\\u0061me": "escaped key"}',
    '{"ph": "X", "ts": 1, "dur": 1,}',  # not JSON
    '{"ph": "X", "name": "\\u0000"}',
    '{"ph": "X", "name": "\\ud800"}',  # a lone surrogate
]


@pytest.mark.parametrize("event", DECLINED, ids=range(len(DECLINED)))
def test_decoder_declines(event):
    text = run_of(TAKEN[0], event)
    assert kineto._events.decode(text, 0, 0) is None
    agree(text)


def test_invalid_utf8_is_declined():
    assert kineto._events.decode(b'[{"ph": "X", "name": "\xff"}]', 0, 0) is None


# -- generated runs ---------------------------------------------------------------------------------

_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args", "tts", "cname"]
_ARG_KEYS = [a.key for a in kineto.ARG_COLUMNS] + ["ts", "x", "name"]


def _num_text(draw) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return str(draw(st.integers(-(1 << 70), 1 << 70)))
    x = draw(st.floats(allow_nan=False, allow_infinity=False, width=64))
    if kind == 1:
        return repr(x)
    if kind == 2:
        return f"{x:.{draw(st.integers(0, 8))}f}"
    if kind == 3:
        return f"{x:.{draw(st.integers(0, 17))}e}".replace("e+", draw(st.sampled_from(["e+", "E", "e"])))
    if kind == 4:  # microsecond timestamps, relative and absolute
        us = draw(st.integers(0, 10 ** 17))
        return f"{us}.{draw(st.integers(0, 999_999)):0{draw(st.integers(1, 6))}d}"[:40]
    return draw(st.sampled_from(["0", "-0", "0.0", "-0.0", "1e21", "1e-7", "26.214400000000001"]))


@st.composite
def _value(draw, depth=0):
    kind = draw(st.integers(0, 6 if depth < 3 else 3))
    if kind == 0:
        return _num_text(draw)
    if kind == 1:
        return json.dumps(draw(st.text(max_size=12)), ensure_ascii=draw(st.booleans()))
    if kind == 2:
        return draw(st.sampled_from(["true", "false", "null"]))
    if kind == 3:
        return json.dumps(draw(st.sampled_from(["X", "M", "i", "[memory]", "12", "-0", "Spans", "007"])))
    if kind == 4:
        return "[" + ", ".join(draw(st.lists(_value(depth + 1), max_size=4))) + "]"
    keys = draw(st.lists(st.sampled_from(_ARG_KEYS), max_size=5))
    return "{" + ", ".join(f"{json.dumps(k)}: {draw(_value(depth + 1))}" for k in keys) + "}"


def _typed(draw, key: str) -> str:
    """A value of the kind the key's column takes (most of the time), or any value."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_value())
    if key in ("ph", "cat", "name", "bp", "s"):
        return draw(_value().filter(lambda v: v.startswith('"'))) if key == "name" else \
            json.dumps(draw(st.sampled_from(["X", "M", "i", "s", "f", "kernel", "cpu_op", "[memory]", "e"])))
    if key in ("pid", "tid", "id"):
        return draw(st.one_of(st.integers(-(1 << 63), (1 << 63) - 1).map(str),
                              st.sampled_from(['"Spans"', '"12"', '"-0"', '"007"', '"0x2a"'])))
    if key in ("ts", "dur"):
        return _num_text(draw)
    if key == "args":
        keys = draw(st.lists(st.sampled_from(_ARG_KEYS), max_size=6))
        return "{" + ", ".join(f"{json.dumps(k)}: {draw(_value(1))}" for k in keys) + "}"
    return draw(_value())


@st.composite
def _event(draw):
    keys = draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=8, unique=True))
    return "{" + ", ".join(f'"{k}": {_typed(draw, k)}' for k in keys) + "}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event(), min_size=1, max_size=6))
def test_generated_runs_agree(events):
    agree(run_of(*events))


# -- whole stores -----------------------------------------------------------------------------------

def _tables(store: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect()
    out = {}
    for table in sorted(p.name for p in store.iterdir() if p.is_dir() and any(p.rglob("*.parquet"))):
        rel = f"read_parquet('{store / table}/**/*.parquet', hive_partitioning = true)"
        out[table] = sorted(con.execute(f"SELECT * FROM {rel}").fetchall(), key=repr)
    return out


def _same_store(trace_dir: Path, tmp_path: Path, monkeypatch) -> None:
    # every run of the fast ingest (jobs=1: in this process) must be written from the decoder's columns, none by
    # the general path: a decoder that declined them all would leave both stores the general path's, equal and
    # proving nothing. (The reader may offer the decoder a longer segment first and a shorter one after: a
    # decline of the decoder is not a run on the general path, a run written by _write_events is.)
    written = {"decoded": 0, "general": []}

    def decoded(con, run, target):
        written["decoded"] += 1
        return write_decoded(con, run, target)

    def general(con, params, text, target):
        written["general"].append(params["first_id"])
        return write_events(con, params, text, target)

    write_decoded, write_events = kineto._write_decoded, kineto._write_events
    monkeypatch.setattr(kineto, "_write_decoded", decoded)
    monkeypatch.setattr(kineto, "_write_events", general)
    ingest(str(trace_dir), str(tmp_path / "fast"), jobs=1, force=True, progress=False)
    monkeypatch.setattr(kineto, "_write_decoded", write_decoded)
    monkeypatch.setattr(kineto, "_write_events", write_events)
    assert written["decoded"] and not written["general"], (
        f"{trace_dir.name}: {len(written['general'])} of {written['decoded'] + len(written['general'])} runs went to "
        f"the general path, the compiled decoder declining them (first events: {written['general'][:5]})")
    monkeypatch.setenv("TRACEKIT_DECODER", "duckdb")
    ingest(str(trace_dir), str(tmp_path / "general"), jobs=1, force=True, progress=False)
    fast, general = _tables(tmp_path / "fast"), _tables(tmp_path / "general")
    assert fast.keys() == general.keys()
    for table in fast:
        assert fast[table] == general[table], f"{trace_dir.name}: table {table} differs"


@pytest.mark.parametrize("sample", sorted(str(p.parent.relative_to(REPO / "sample_traces"))
                                          for p in (REPO / "sample_traces").glob("**/run.json")))
def test_bundled_samples_give_the_same_store(sample, tmp_path, monkeypatch):
    _same_store(REPO / "sample_traces" / sample, tmp_path, monkeypatch)


_SHARED = ["astra-sim/megatron_tp8", "hta/amd_trace", "hta/cpu_only", "hta/cupti_profiler", "hta/df_index_resolver",
           "hta/nccl_parser_config", "hta/ns_resolution_trace", "hta/trace_filter", "hta/triton_example",
           "tracelens/b200_eager", "tracelens/h100_qwen_inference"]


@pytest.mark.slow
@pytest.mark.parametrize("rel", _SHARED)
def test_shared_traces_give_the_same_store(rel, tmp_path, monkeypatch):
    _same_store(shared_trace_dir(rel), tmp_path, monkeypatch)


@pytest.mark.parametrize("rel", _SHARED)
def test_shared_traces_take_the_decoder(rel):
    """Every run of every real trace goes through the decoder: none is left to the slower path."""
    for f in sorted(shared_trace_dir(rel).glob("*.json*")):
        runs = [run for _, _, _, run in TraceStream(str(f), decoder=kineto._decoder()).batches()]
        assert all(r is not None for r in runs), f"{f.name}: {sum(r is None for r in runs)} of {len(runs)} runs declined"


def test_decoder_takes_only_valid_json():
    """The reader skips its JSON check on a run the decoder takes (TraceStream's decoder): so the decoder must
    take only complete, valid JSON. Byte-mutated runs of the bundled samples that it takes decode with
    msgspec, to as many events."""
    import random

    import msgspec

    check = msgspec.json.Decoder(list[msgspec.Raw])
    seeds = [text for f in sorted((REPO / "sample_traces").glob("*/rank*.trace.json*"))
             for text, _, _, _ in TraceStream(str(f), chunk_bytes=4 << 10).batches()][:400]
    rng = random.Random(20261203)
    alphabet = b'{}[]",:\\ \t\n\r\x0b\x0c01-+.eE9atrufnlsx\x00\x1f\x7f\xc3\xa9\xff/'
    taken = 0
    for _ in range(6000):
        t = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            i, c = rng.randrange(len(t)), bytes([rng.choice(alphabet)])
            op = rng.randrange(3)
            if op == 0:
                t[i:i + 1] = c
            elif op == 1:
                t[i:i] = c
            else:
                del t[i]
        run = kineto._events.decode(bytes(t), 0, 0)
        if run is not None:
            taken += 1
            assert len(check.decode(bytes(t))) == run.rows, bytes(t)[:300]
    assert taken > 500  # the test reaches the decoder's accepting side
