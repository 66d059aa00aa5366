"""Hostile files in a trace directory: special files, symlink loops, impossible distributedInfo, and a
malformed number inside traceEvents. Each is skipped with a line naming it, or is one clear error naming
the file and the field; nothing hangs."""
from __future__ import annotations

import gzip
import json
import os

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.errors import TraceFileError
from tracekit.ingest import ingest

from .conftest import tiny_events, write_trace
from .test_fuzz_ingest import watchdog


def _ops(n: int) -> list[str]:
    return [json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1000 + 10 * i,
                        "dur": 5, "args": {"External id": i}}) for i in range(n)]


def _doc(events: list[str]) -> bytes:
    return ('{"schemaVersion": 1, "traceEvents": [' + ", ".join(events) + "]}").encode()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_named_like_a_trace_is_skipped_without_opening_it(tmp_path):
    d = tmp_path / "t"
    write_trace(d / "rank0.json", tiny_events(1))
    os.mkfifo(d / "rank1.json")
    os.mkfifo(d / "inspector.log")  # sniffing a *.log reads it: a FIFO must not get there either
    with watchdog(30):
        r = CliRunner().invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "skipped rank1.json: a FIFO (named pipe), not a regular file: not opened; move it out of the trace " \
           "directory" in r.stderr.splitlines()
    assert any(line.startswith("skipped inspector.log: a FIFO") for line in r.stderr.splitlines())
    assert tracekit.open(str(tmp_path / "s")).ranks == [0]


def test_symlink_loops_are_not_followed(tmp_path):
    d = tmp_path / "t"
    write_trace(d / "rank0.json", tiny_events(1))
    os.symlink("loop2.json", d / "loop1.json")
    os.symlink("loop1.json", d / "loop2.json")
    os.symlink("nowhere.json", d / "dangling.json")
    (d / "sub").mkdir()
    os.symlink("..", d / "sub" / "up")  # a directory loop: walking it would find rank0.json again and again
    with watchdog(30):
        report = ingest(str(d), str(tmp_path / "s"))
    assert report.unopened == {"dangling.json": "a symlink to nothing: not followed",
                               "loop1.json": "a symlink loop: not followed",
                               "loop2.json": "a symlink loop: not followed"}
    assert report.ingested == ["rank0.json"]
    # a symlink to a trace is an ordinary input
    d2 = tmp_path / "u"
    d2.mkdir()
    os.symlink(d / "rank0.json", d2 / "rank0.json")
    assert ingest(str(d2), str(tmp_path / "s2")).ingested == ["rank0.json"]


@pytest.mark.parametrize("info,field,shown", [
    ({"rank": 0, "world_size": 0}, "world_size", "0"),
    ({"rank": 0, "world_size": -5}, "world_size", "-5"),
    ({"rank": 0, "world_size": "eight"}, "world_size", '"eight"'),
    ({"rank": 0, "world_size": 2.5}, "world_size", "2.5"),
    ({"rank": 2, "world_size": 2}, "rank", "2"),
    ({"rank": -1, "world_size": 2}, "rank", "-1"),
    ({"rank": 1.5, "world_size": 2}, "rank", "1.5"),
    ({"rank": "first", "world_size": 2}, "rank", '"first"'),
    ({"rank": True, "world_size": 2}, "rank", "true"),
    ({"rank": -3}, "rank", "-3"),
])
def test_impossible_distributed_info_names_the_file_and_field(tmp_path, info, field, shown):
    d = tmp_path / "t"
    d.mkdir()
    doc = {"traceEvents": tiny_events(1), "distributedInfo": {"backend": "nccl", **info}}
    (d / "rank0.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2, r.output
    lines = r.output.splitlines()
    assert len(lines) == 1 and "rank0.json" in lines[0] and f"distributedInfo.{field} is {shown}:" in lines[0]
    assert "fix the trace's distributedInfo" in lines[0]


def test_distributed_info_in_range_and_numeric_text_still_ingest(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    doc = {"traceEvents": tiny_events(1), "distributedInfo": {"rank": "3", "world_size": 4.0}}
    (d / "r.json").write_text(json.dumps(doc))
    run = tracekit.open(str(d), store=str(tmp_path / "s"))
    assert run.ranks == [3] and run.info()["world_size"] == 4


@pytest.mark.parametrize("gz", [False, True])
def test_malformed_number_salvages_the_events_before_it(tmp_path, gz):
    events = _ops(5)
    events[3] = events[3].replace('"dur": 5', '"dur": 5.5.5')
    text = _doc(events)
    broken_at = text.index(b"5.5.5") + 3  # the second '.'
    d = tmp_path / "t"
    d.mkdir()
    name = "rank0.json.gz" if gz else "rank0.json"
    (d / name).write_bytes(gzip.compress(text) if gz else text)
    report = ingest(str(d), str(tmp_path / "s"))
    file = "decompressed file" if gz else "file"
    assert report.warnings[name] == [
        f"traceEvents[3] is not valid JSON at byte {broken_at} of the {file} (expected ',' or '}}'): kept the 3 "
        "events before it, lost 2 event(s) from there on and any metadata after traceEvents; fix or drop that event"]
    run = tracekit.open(str(tmp_path / "s"))
    assert run.sql("SELECT name FROM events ORDER BY ts_ns")["name"].tolist() == ["op0", "op1", "op2"]
    assert run.sql("SELECT lost_event_count FROM ranks")["lost_event_count"][0] == 2


def test_malformed_number_deep_in_a_long_trace(tmp_path):
    """Past the first chunks: every chunk before the broken one is kept, and the event index is exact."""
    from tracekit.ingest.kineto import ingest_kineto

    events = _ops(3000)
    events[2345] = events[2345].replace('"ts": 24450', '"ts": 24450e')
    p = tmp_path / "rank0.json"
    p.write_bytes(_doc(events))
    r = ingest_kineto(str(p), "rank0.json", str(tmp_path / "stage"), chunk_bytes=16 << 10)
    assert r.event_count == 2345 and r.lost_event_count == 655
    assert r.warnings[0].startswith("traceEvents[2345] is not valid JSON at byte ")


def test_malformed_first_event_says_where_not_empty(tmp_path):
    events = _ops(3)
    events[0] = events[0].replace('"dur": 5', '"dur": -')
    d = tmp_path / "t"
    d.mkdir()
    (d / "rank0.json").write_bytes(_doc(events))
    with pytest.raises(TraceFileError) as e:
        ingest(str(d), str(tmp_path / "s"))
    msg = str(e.value)
    assert "rank0.json" in msg and "traceEvents[0] is not valid JSON at byte" in msg and "empty" not in msg


@pytest.mark.parametrize("decoder", ["compiled", "duckdb"])
@pytest.mark.parametrize("field, value, shown", [
    ("dur", 5_000_000_000_000_000, "traceEvents[2]: its ts + dur ends beyond what 64-bit nanoseconds hold"),
    ("dur", None, "traceEvents[2]: a complete event (ph X) needs numeric 'ts' and 'dur'"),
])
def test_complete_event_without_an_end_is_named(tmp_path, monkeypatch, decoder, field, value, shown):
    """A complete event whose end is missing or beyond int64 ns (a 158-year duration) is one error naming the
    event, on both paths (it was a DuckDB overflow traceback), and the store already there is kept."""
    if decoder == "duckdb":
        monkeypatch.setenv("TRACEKIT_DECODER", "duckdb")
    events = [json.loads(e) for e in _ops(4)]
    events[2]["ts"] = 5_000_000_000_000_000
    events[2][field] = value
    d = tmp_path / "t"
    d.mkdir()
    (d / "rank0.json").write_bytes(_doc(_ops(4)))
    store = str(tmp_path / "s")
    assert CliRunner().invoke(cli, ["ingest", str(d), "--store", store]).exit_code == 0
    (d / "rank0.json").write_bytes(_doc([json.dumps(e) for e in events]))
    r = CliRunner().invoke(cli, ["ingest", str(d), "--store", store])
    assert r.exit_code == 2, r.output
    assert shown in r.stderr and "rank0.json" in r.stderr and "Traceback" not in r.output
    assert int(tracekit.open(store).sql("SELECT count(*) AS n FROM events")["n"][0]) == 4


@pytest.mark.parametrize("decoder", ["compiled", "duckdb"])
def test_a_lone_surrogate_escape_keeps_its_event_with_a_replacement_character(tmp_path, monkeypatch, decoder):
    """A name holding \\ud800 (half of a UTF-16 pair: valid JSON syntax, no character) is kept with U+FFFD in
    its place, on both readers, and the warning names the event; the events after it and the metadata after
    traceEvents (distributedInfo: rank 1 of 2) are kept too. It had cost the rest of the file, and the whole
    trace when it was the first event."""
    if decoder == "duckdb":
        monkeypatch.setenv("TRACEKIT_DECODER", "duckdb")
    elif tracekit.ingest.kineto._events is None:
        pytest.skip("the compiled events decoder is not built")
    else:
        monkeypatch.delenv("TRACEKIT_DECODER", raising=False)  # CI's second run sets it
    ops = _ops(6)
    ops[0] = ops[0].replace('"op0"', '"\\ud800op0"')  # the first event: nothing before it to keep
    ops[3] = ops[3].replace('"op3"', '"op\\udc003"')  # a lone low half
    ops[4] = ops[4].replace('"op4"', '"op4 \\ud83d\\ude00 \\\\ud800"')  # a pair, and an escaped backslash: kept as they are
    d = tmp_path / "t"
    d.mkdir()
    (d / "trace.json").write_bytes(_doc(ops)[:-1] + b', "distributedInfo": {"rank": 1, "world_size": 2}}')
    report = ingest(str(d), str(tmp_path / "s"))
    assert report.warnings == {"trace.json": [(
        "traceEvents[0] and 1 more event(s): a string held a lone UTF-16 surrogate escape (such as \\ud800, half "
        "of a pair: no character); kept the event with U+FFFD in its place")]}
    run = tracekit.open(str(d), store=str(tmp_path / "s"))
    names = run.sql("SELECT rank, name FROM events ORDER BY event_id")
    assert names["rank"].tolist() == [1] * 6
    assert names["name"].tolist() == ["\ufffdop0", "op1", "op2", "op\ufffd3", "op4 \U0001F600 \\ud800", "op5"]


def test_lone_surrogate_escapes_are_told_from_pairs_and_escaped_backslashes():
    from tracekit.ingest.reader import _lone_surrogates, _replace_lone_surrogates

    text = rb'"\ud800", "\udfff", "\ud83d\ude00", "\\ud800", "\\\ud800", "\ud800\ud800", "\ud800\u0041", "\uD7FF"'
    lone = _lone_surrogates(text)
    assert [text[i:i + 6] for i in lone] == [rb"\ud800", rb"\udfff", rb"\ud800", rb"\ud800", rb"\ud800", rb"\ud800"]
    assert lone == [1, 11, 50, 60, 66, 76]  # not the escaped backslash at 37, nor the pair at 21
    repaired, _ = _replace_lone_surrogates(text)
    assert json.loads(b"[" + repaired + b"]") == ["\ufffd", "\ufffd", "\U0001F600", "\\ud800", "\\\ufffd",
                                                  "\ufffd\ufffd", "\ufffdA", "\ud7ff"]
    assert _lone_surrogates(b'"plain \\u00e9"') == []
