"""--executor: the local pool's forms, bad strings, and a real Dask cluster giving the same store as local."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.errors import TraceFileError, TracekitError
from tracekit.ingest import ingest
from tracekit.ingest.executor import Executor, parse_executor
from tracekit.store import Store
from tracekit.store.schema import TABLES

from .conftest import REPO

pytestmark = pytest.mark.slow  # starts Dask clusters

SAMPLE = REPO / "sample_traces" / "ddp4_loopback"
# the trace files only: the README's first command ingests the sample in place, and its store must not come along
TRACES_ONLY = shutil.ignore_patterns(".tracekit")


def test_parse_executor_forms():
    assert parse_executor(None) == Executor("local")
    assert parse_executor("local") == Executor("local")
    assert parse_executor("local[3]") == Executor("local", jobs=3)
    assert parse_executor("dask://scheduler.example:8786") == Executor("dask", address="tcp://scheduler.example:8786")
    assert parse_executor("dask://10.0.0.7:8786").address == "tcp://10.0.0.7:8786"
    assert str(parse_executor("dask://h:1")) == "dask://h:1"


@pytest.mark.parametrize("spec", ["", "locl", "local[]", "local[0]", "local[x]", "local[9999]", "dask://", "dask://host",
                                  "dask://host:port", "dask://host:99999", "tcp://host:8786", "dask:host:8786",
                                  "spark://host:7077"])
def test_bad_executor_is_one_clear_error(spec):
    with pytest.raises(TracekitError) as e:
        parse_executor(spec)
    msg = str(e.value)
    assert msg.startswith("--executor") and "local[N]" in msg and "dask://HOST:PORT" in msg and "\n" not in msg


def test_cli_bad_executor_exit_2_no_traceback(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    r = CliRunner().invoke(cli, ["ingest", str(d), "--executor", "yarn"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output and r.output.count("\n") == 1
    assert "--executor 'yarn'" in r.output and "dask://HOST:PORT" in r.output
    assert not (d / ".tracekit" / "manifest.json").exists()


def test_jobs_and_executor_must_agree(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    with pytest.raises(TracekitError, match="--jobs 2 and --executor local\\[3\\] disagree"):
        ingest(str(d), jobs=2, executor="local[3]")
    with pytest.raises(TracekitError, match="--jobs applies to the local executor"):
        ingest(str(d), jobs=2, executor="dask://127.0.0.1:1")


def test_local_n_gives_the_same_store(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    ingest(str(d), str(tmp_path / "a"), executor="local[1]", progress=False)
    ingest(str(d), str(tmp_path / "b"), executor="local[2]", progress=False)
    _assert_same_store(tmp_path / "a", tmp_path / "b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _table(store_dir: Path, table: str):
    con = Store(str(store_dir)).connect()
    try:
        return con.sql(f"SELECT * FROM {table}").to_arrow_table()
    finally:
        con.close()


def _assert_same_store(a: Path, b: Path) -> None:
    ma, mb = Store(str(a)).manifest, Store(str(b)).manifest
    assert sorted(ma.sources) == sorted(mb.sources)
    con = duckdb.connect()
    views = ["events", "steps", "flows", "memory", "gpu_args", "comm_args", "fr_entries", "nccl_inspector"]
    # ranks: everything but nothing time-dependent is stored there, so compare it whole too
    for table in ["ranks", *views]:
        ta, tb = _table(a, table), _table(b, table)  # noqa: F841 (read by DuckDB below)
        assert ta.num_rows == tb.num_rows, table
        for x, y in (("ta", "tb"), ("tb", "ta")):
            extra = con.execute(f"SELECT count(*) FROM (SELECT * FROM {x} EXCEPT ALL SELECT * FROM {y})").fetchone()[0]
            assert extra == 0, f"{table}: {extra} rows of {x} not in {y}"
    for table in TABLES:  # the same files per rank and table
        for src in ma.sources:
            assert len(ma.sources[src].files.get(table, [])) == len(mb.sources[src].files.get(table, [])), (src, table)


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed", reason="distributed not installed (pip install 'tracekit[dask]')")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=50)
    try:
        yield cluster
    finally:
        cluster.close()


def _dask_spec(cluster) -> str:
    return "dask://" + cluster.scheduler_address.removeprefix("tcp://")


def test_dask_store_identical_to_local(dask_cluster, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    r = ingest(str(d), str(tmp_path / "dask-store"), executor=_dask_spec(dask_cluster), progress=False)
    assert len(r.ingested) == 8 and not r.failed  # 4 traces (on the workers) + 4 flight-recorder dumps
    ingest(str(d), str(tmp_path / "local-store"), progress=False)
    _assert_same_store(tmp_path / "dask-store", tmp_path / "local-store")
    # hive-partitioned Parquet that any engine reads without tracekit
    n = duckdb.sql(f"SELECT count(DISTINCT rank) FROM read_parquet('{tmp_path}/dask-store/events/*/*.parquet', "
                   "hive_partitioning = true)").fetchall()[0][0]
    assert n == 4
    # incremental: nothing changed, nothing is sent to the cluster
    r = ingest(str(d), str(tmp_path / "dask-store"), executor=_dask_spec(dask_cluster), progress=False)
    assert r.ingested == [] and len(r.unchanged) == 8


def test_dask_bad_file_leaves_store_unchanged(dask_cluster, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    store = tmp_path / "store"
    ingest(str(d), str(store), executor=_dask_spec(dask_cluster), progress=False)
    before = (store / "manifest.json").read_bytes()
    bad = d / "rank2.trace.json.gz"
    doc = json.loads(gzip.decompress(bad.read_bytes()))
    i = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    doc["traceEvents"][i]["dur"] = "soon"  # found by the worker, not by the client's sniffing
    bad.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(TraceFileError) as e:
        ingest(str(d), str(store), executor=_dask_spec(dask_cluster), progress=False)
    assert e.value.path.endswith("rank2.trace.json.gz") and f"traceEvents[{i}]" in str(e.value)
    assert (store / "manifest.json").read_bytes() == before
    assert not (store / "staging").exists()
    # --skip-bad: the other files are committed, the bad one listed
    r = ingest(str(d), str(store), executor=_dask_spec(dask_cluster), progress=False, skip_bad=True)
    assert list(r.failed) == ["rank2.trace.json.gz"]


def test_dask_unreachable_scheduler_is_one_clear_error(tmp_path):
    pytest.importorskip("distributed", reason="distributed not installed")
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=TRACES_ONLY)
    r = CliRunner().invoke(cli, ["ingest", str(d), "--executor", f"dask://127.0.0.1:{_free_port()}"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--executor dask://127.0.0.1:" in r.output and "cannot reach the Dask scheduler" in r.output
    assert not os.path.exists(d / ".tracekit" / "manifest.json")
