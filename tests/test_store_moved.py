"""A store moved, copied or replaced underneath: its views (the cached views database in <store>/cache, which
names absolute Parquet paths) are rebuilt for what is there, or the query says what happened; a view naming
files that are gone is never served. And `tracekit report` exits non-zero when a section fails."""
from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.errors import StoreError, TracekitError
from tracekit.ingest import ingest

from .conftest import REPO

STEPS = "SELECT count(*) AS n FROM steps"


@pytest.fixture
def trace(tmp_path):
    d = tmp_path / "trace"
    shutil.copytree(REPO / "sample_traces" / "ddp4_loopback", d, ignore=shutil.ignore_patterns(".tracekit"))
    with tracekit.open(d) as run:  # the default store, <trace>/.tracekit
        assert run.sql(STEPS).n[0] == 12
    return d


def _views_dbs(store) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(store, "cache")) if n.startswith("views-"))


def test_store_moved_away_from_a_live_run_and_back(trace, tmp_path):
    store, away = trace / ".tracekit", tmp_path / "away"
    run = tracekit.open(trace, ingest=False)
    assert run.sql(STEPS).n[0] == 12
    shutil.move(store, away)
    # the query that read "no findings: query failed: IO Error: No files found ..." in a report
    with pytest.raises(StoreError, match=r"\.tracekit: the store was moved or removed while in use \(IO Error: No "
                                         r"files found .*\); open it where it is now"):
        run.sql(STEPS)
    with tracekit.open(away) as moved:  # opened where it is: views of its own files, for its own path
        assert moved.sql(STEPS).n[0] == 12
        assert all(f.startswith(str(away) + os.sep) for f in moved.store.files("steps"))
    shutil.move(away, store)
    assert run.sql(STEPS).n[0] == 12
    run.close()
    with tracekit.open(trace) as again:
        assert again.sql(STEPS).n[0] == 12


def test_copied_store_reads_its_own_files(trace, tmp_path):
    copy = tmp_path / "copy"
    original_views = _views_dbs(trace / ".tracekit")
    shutil.copytree(trace / ".tracekit", copy)  # the cached views database comes along
    shutil.rmtree(trace)  # the original's files are gone: a copy that used its views would find nothing
    with tracekit.open(copy) as run:
        assert run.sql(STEPS).n[0] == 12
        assert all(f.startswith(str(copy) + os.sep) for f in run.store.files("steps"))
    views = _views_dbs(copy)  # the copied one, named for the original's path, was replaced by the copy's own
    assert len(views) == 1 and views != original_views


def test_store_replaced_underneath_a_live_run(trace):
    run = tracekit.open(trace, ingest=False)
    before = set(run.store.files("steps"))
    assert run.sql(STEPS).n[0] == 12
    ingest(str(trace), force=True, progress=False, jobs=1)  # another process's ingest: new files, old ones removed
    assert not any(os.path.exists(f) for f in before)
    assert run.sql(STEPS).n[0] == 12  # views rebuilt for the store now committed, the query run again
    assert set(run.store.files("steps")).isdisjoint(before)
    run.close()


@pytest.mark.parametrize("lost", ["steps/rank=1", "steps"])
def test_files_missing_under_the_manifest_are_named_never_served(trace, lost):
    store = trace / ".tracekit"
    shutil.rmtree(store / lost)
    with tracekit.open(trace) as run:  # an unchanged trace: ingest has nothing to do
        with pytest.raises(StoreError, match=r"file\(s\) its manifest names are missing \(e\.g\. steps/rank=.*\.parquet"
                                             r"\): the store was moved, copied in part or changed underneath; run "
                                             r"`tracekit ingest --force`"):
            run.sql(STEPS)
    res = CliRunner().invoke(cli, ["query", str(trace), STEPS])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "ingest --force" in res.output, res.output
    ingest(str(trace), force=True, progress=False, jobs=1)
    with tracekit.open(trace) as run:
        assert run.sql(STEPS).n[0] == 12


def test_report_says_which_section_failed_and_exits_2(trace, tmp_path, monkeypatch):
    pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")
    from tracekit.report import data

    def broken(run):
        raise TracekitError("query failed: IO Error: No files found that match the pattern \"x.parquet\"")

    monkeypatch.setitem(data.PANEL_DATA, "memory_timeline", (broken, "analysis memory_timeline"))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(trace), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert f"{out}: written, but 1 section(s) failed: memory_timeline: query failed: IO Error" in res.output
    assert "No files found" in out.read_text()  # the page says it too, in that panel


def test_report_on_a_store_moved_away_fails_its_sections(trace, tmp_path):
    pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")
    from tracekit.report.html import ReportIncomplete, write_report

    run = tracekit.open(trace, ingest=False)
    run.sql(STEPS)
    shutil.move(trace / ".tracekit", tmp_path / "away")
    with pytest.raises(ReportIncomplete) as e:
        write_report(run, tmp_path / "r.html")
    failed = dict(e.value.failed)
    assert {"mfu", "findings", "step_time"} <= set(failed)
    assert all("the store was moved or removed while in use" in why for why in failed.values()), failed
    assert "<h2>Findings</h2><p>failed: " in (tmp_path / "r.html").read_text()
    run.close()
