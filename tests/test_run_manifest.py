"""run.json lives in the store: a store moved away from its traces keeps its hosts and parallel layout,
run.json is re-ingested when it changes like any source, a bad one is refused without touching the store,
and nothing downstream of ingest reads the trace directory."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

import replay
import tracekit
from analyses.depgraph.load import _hosts
from replay.parallelism import layout
from replay.scenario import scenario_from_dict
from tracekit.cli import cli
from tracekit.errors import TraceFileError
from tracekit.ingest import ingest
from tracekit.store import Store

from .conftest import REPO

SAMPLE = REPO / "sample_traces" / "ddp2_2hosts_100mbit"  # two testbed hosts, run.json with a parallel block


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=shutil.ignore_patterns(".tracekit"))
    return d


def test_moved_store_keeps_hosts_and_layout(run_dir, tmp_path):
    store = tmp_path / "store"
    ingest(str(run_dir), str(store), progress=False)
    dp4 = scenario_from_dict({"parallelism": {"dp": 4}}, "dp4")
    with tracekit.open(str(store)) as run:
        hosts, lay = _hosts(run), layout(run)
        predicted = replay.run(run, dp4).summary()
    assert lay["dp"] == 2 and hosts.hostname.nunique() == 2
    # the store alone, somewhere else, its trace directory gone
    moved = tmp_path / "elsewhere" / "store"
    shutil.copytree(store, moved)
    shutil.rmtree(store)
    shutil.rmtree(run_dir)
    with tracekit.open(str(moved)) as run:
        assert run.run_manifest() == json.loads((SAMPLE / "run.json").read_text())
        assert _hosts(run).equals(hosts) and layout(run) == lay
        assert replay.run(run, dp4).summary().equals(predicted)


def test_run_manifest_is_a_source_like_any_other(run_dir, tmp_path):
    store = tmp_path / "store"
    first = ingest(str(run_dir), str(store), progress=False)
    assert "run.json" not in first.ingested and "run.json" not in first.skipped  # a run's metadata, not an input
    assert Store(str(store)).manifest.sources["run.json"].kind == "run_manifest"
    assert ingest(str(run_dir), str(store), progress=False).ingested == []
    doc = json.loads((run_dir / "run.json").read_text())
    doc["parallel"]["global_batch_size"] = 1234
    (run_dir / "run.json").write_text(json.dumps(doc))
    again = ingest(str(run_dir), str(store), progress=False)
    assert again.ingested == []  # the traces were not read again
    with tracekit.open(str(store)) as run:
        assert run.run_manifest()["parallel"]["global_batch_size"] == 1234
        assert run.sql("SELECT manifest_version, source_file FROM run_manifest").values.tolist() == [[1, "run.json"]]
    (run_dir / "run.json").unlink()
    ingest(str(run_dir), str(store), progress=False)
    with tracekit.open(str(store)) as run:
        # gone from the store; the layout now comes from the traces' distributedInfo alone
        assert run.run_manifest() == {} and layout(run)["source"] == "distributedInfo"
        assert layout(run)["global_batch_size"] is None


@pytest.mark.parametrize("text", ['{"world_size": 2', "[1, 2]"])
def test_bad_run_manifest_is_refused_and_the_store_kept(run_dir, tmp_path, text):
    store = tmp_path / "store"
    ingest(str(run_dir), str(store), progress=False)
    before = (store / "manifest.json").read_bytes()
    (run_dir / "run.json").write_text(text)
    with pytest.raises(TraceFileError, match=r"run\.json: cannot read the run manifest"):
        ingest(str(run_dir), str(store), progress=False)
    assert (store / "manifest.json").read_bytes() == before
    r = CliRunner().invoke(cli, ["ingest", str(run_dir), "--store", str(store)])
    assert r.exit_code == 2 and "run.json" in r.output and "Traceback" not in r.output, r.output
    assert (store / "manifest.json").read_bytes() == before
    # --skip-bad leaves it out like any unreadable file; the traces still make a store
    skipped = ingest(str(run_dir), str(store), skip_bad=True, progress=False)
    assert list(skipped.failed) == ["run.json"]
    with tracekit.open(str(store)) as run:
        assert run.run_manifest() == {}


def test_nothing_downstream_reads_the_trace_directory():
    # run.json comes from Run.run_manifest(); the trace directory itself is never opened after ingest
    reads = re.compile(r"capture\.manifest|capture import manifest|run\.trace_dir|getattr\([^)]*\"trace_dir\"")
    offenders = [f"{p.relative_to(REPO)}:{i}: {line.strip()}"
                 for top in ("replay", "analyses") for p in sorted((REPO / top).rglob("*.py"))
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if reads.search(line)]
    assert offenders == []
