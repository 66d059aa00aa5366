"""The compiled events decoder's contract, apart from its output (tests/test_ingest_fastpath.py checks that it
equals DuckDB's reader): its columns are the schema's, a decoder that cannot be used is said (ingest's note,
`tracekit info`), and README.md and setup.py give the one measured figure for ingest without it."""
from __future__ import annotations

import importlib
import types

import duckdb
import pytest
from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.ingest import ingest, kineto
from tracekit.store.schema import STORED_EVENT_COLUMNS

from .conftest import REPO


def test_decoder_columns_are_the_schemas():
    """_events.COLUMNS and the types of the Arrow stream it hands DuckDB: the stored event columns in the
    schema's order, then _deferred (kineto._write_decoded drops it)."""
    try:
        events = importlib.import_module("tracekit.ingest._events")
    except ImportError:
        pytest.skip("the compiled events decoder is not built")
    assert events.COLUMNS == tuple(c for c, _, _ in STORED_EVENT_COLUMNS) + ("_deferred",)
    assert kineto._unusable(events) is None
    run = events.decode(b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"stream": 7}}]', 0, 0)  # noqa: F841 (SQL)
    con = duckdb.connect()
    described = con.execute("DESCRIBE SELECT * FROM run").fetchall()
    assert [(c, t) for c, t, *_ in described] == [(c, t) for c, t, _ in STORED_EVENT_COLUMNS] + [("_deferred", "VARCHAR")]


def test_a_decoder_of_other_columns_is_not_used():
    stale = types.SimpleNamespace(COLUMNS=tuple(c for c, _, _ in STORED_EVENT_COLUMNS))  # without _deferred
    assert "older _events.c" in kineto._unusable(stale)
    assert "not built" in kineto._unusable(None)


def test_ingest_and_info_say_when_the_decoder_is_missing(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEKIT_DECODER", raising=False)
    monkeypatch.setattr(kineto, "_events", None)
    monkeypatch.setattr(kineto, "_EVENTS_UNUSED", "not built (no C compiler at install?)")
    report = ingest(str(tiny_dir), str(tmp_path / "s"))
    assert report.decoder_note == kineto.decoder_in_use()
    assert report.decoder_note.startswith("DuckDB's JSON reader: the compiled decoder (tracekit/ingest/_events.c) "
                                          "is not built")
    assert f"takes {kineto.DUCKDB_PATH_SLOWER} as long" in report.decoder_note
    runner = CliRunner()
    r = runner.invoke(cli, ["ingest", str(tiny_dir), "--store", str(tmp_path / "s2")])
    assert r.exit_code == 0, r.output
    assert f"note: {kineto.decoder_in_use()}" in r.stderr
    assert ingest(str(tiny_dir), str(tmp_path / "s2")).decoder_note is None  # nothing read: nothing to say
    r = runner.invoke(cli, ["info", str(tiny_dir), "--store", str(tmp_path / "s")])
    assert f"ingest's events decoder: {kineto.decoder_in_use()}" in r.stdout


def test_info_names_the_decoder_in_use(tiny_dir, tmp_path, monkeypatch):
    if kineto._events is None:
        pytest.skip("the compiled events decoder is not built")
    monkeypatch.delenv("TRACEKIT_DECODER", raising=False)
    r = CliRunner().invoke(cli, ["info", str(tiny_dir), "--store", str(tmp_path / "s"), "--format", "json"])
    assert r.exit_code == 0, r.output
    import json

    assert json.loads(r.stdout)["decoder"].startswith("compiled (tracekit/ingest/_events.c")
    monkeypatch.setenv("TRACEKIT_DECODER", "duckdb")
    assert kineto.decoder_in_use() == "DuckDB's JSON reader (TRACEKIT_DECODER=duckdb)"
    assert ingest(str(tiny_dir), str(tmp_path / "s3")).decoder_note is None  # asked for: no note


def test_readme_and_setup_give_the_measured_figure():
    """One figure for ingest without the compiled decoder (kineto.DUCKDB_PATH_SLOWER, measured), in both places
    that tell a user about it."""
    figure = kineto.DUCKDB_PATH_SLOWER
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    assert f"{figure} as long" in readme
    assert f"{figure} as long" in setup
