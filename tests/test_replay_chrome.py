"""replay.chrome: a store as one Chrome trace (Perfetto UI / chrome://tracing) and as per-rank
Kineto files that `tracekit ingest` reads back to the same events and times."""
from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import duckdb
import pytest

import tracekit
from replay.chrome import write_chrome_trace, write_rank_traces
from replay.writer import write_retimed_store
from tracekit.errors import TracekitError
from tracekit.store import Store, create_table_view
from tracekit.store.schema import TABLES

from .conftest import REPO

SAMPLE = REPO / "sample_traces" / "ddp4_loopback"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("chrome") / "store"
    tracekit.open(SAMPLE, store=str(store)).close()
    return store


def _load(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def _store_sql(store, sql: str):
    con = Store(store).connect()
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _rank_of_pid(doc: dict) -> dict[int, int]:
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            m = re.match(r"rank (\d+):", e["args"]["name"])
            assert m, e
            out[e["pid"]] = int(m.group(1))
    return out


def _check_format(doc: dict) -> None:
    """Trace Event Format as Perfetto's JSON importer and chrome://tracing read it."""
    assert doc["displayTimeUnit"] == "ns" and isinstance(doc["baseTimeNanoseconds"], int)
    assert doc["otherData"]["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]
    events = doc["traceEvents"]
    named_procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    sorted_procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        assert isinstance(e["ph"], str) and isinstance(e["name"], str), e
        assert isinstance(e["pid"], int) and 0 < e["pid"] < 2**31, e
        assert isinstance(e["tid"], int) and 0 <= e["tid"] < 2**31, e
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert e["pid"] in named_procs and e["pid"] in sorted_procs and (e["pid"], e["tid"]) in named_threads, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["cat"], str), e
        if "args" in e:
            assert isinstance(e["args"], dict), e


@pytest.mark.slow  # merged Chrome traces of whole runs
def test_merged_trace_holds_every_rank(src, tmp_path):
    path = write_chrome_trace(str(src), str(tmp_path / "all.json"))
    assert path == str(tmp_path / "all.json")
    doc = _load(Path(path))
    _check_format(doc)
    pid_rank = _rank_of_pid(doc)
    assert sorted(set(pid_rank.values())) == [0, 1, 2, 3]
    # X events per rank, and exact times: base + ts (us, 3 decimals) is the stored ns
    x = Counter(pid_rank[e["pid"]] for e in doc["traceEvents"] if e["ph"] == "X")
    want = dict(_store_sql(src, "SELECT rank, count(*) FROM _events WHERE ph = 'X' GROUP BY rank"))
    assert dict(x) == want
    base = doc["baseTimeNanoseconds"]
    assert base == _store_sql(src, "SELECT min(ts_ns) FROM _events")[0][0]
    got = sorted((pid_rank[e["pid"]], e["name"], e["cat"], base + round(e["ts"] * 1000), round(e["dur"] * 1000))
                 for e in doc["traceEvents"] if e["ph"] == "X")
    stored = sorted(_store_sql(src, "SELECT rank, name, cat, ts_ns, dur_ns FROM _events WHERE ph = 'X'"))
    assert got == stored
    # args are the stored objects
    n_args = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and "args" in e)
    assert n_args == _store_sql(src, "SELECT count(*) FROM _events WHERE ph = 'X' AND args_json IS NOT NULL")[0][0]
    # flows: one s and one f per id, both in one rank; as many as the store pairs
    ends = {}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            ends.setdefault(e["id"], []).append((e["ph"], pid_rank[e["pid"]], e["cat"]))
    assert all(len({r for _, r, _ in v}) == 1 for v in ends.values())
    paired = sum(1 for v in ends.values() if {p for p, _, _ in v} == {"s", "f"})
    assert paired == _store_sql(src, "SELECT count(*) FROM _flows WHERE start_event_id IS NOT NULL "
                                     "AND end_event_id IS NOT NULL")[0][0]
    # the same stream/thread id in two ranks is two tracks
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert len({t for _, t in tracks}) == len(tracks)


def test_gzip_and_a_subset_of_ranks(src, tmp_path):
    path = write_chrome_trace(str(src), str(tmp_path / "some.json.gz"), ranks=[2, 1])
    assert gzip.open(path).read(1)  # really gzip
    doc = _load(Path(path))
    _check_format(doc)
    assert sorted(set(_rank_of_pid(doc).values())) == [1, 2] and doc["otherData"]["ranks"] == [1, 2]
    with pytest.raises(TracekitError, match="no rank 9"):
        write_chrome_trace(str(src), str(tmp_path / "x.json"), ranks=[9])


def test_replayed_store_is_labelled_in_the_trace(src, tmp_path):
    con = Store(src).connect()
    times = con.sql("SELECT rank, event_id, ts_ns + 1000 AS ts_ns, dur_ns FROM _events").to_arrow_table()
    con.close()
    out = write_retimed_store(str(src), str(tmp_path / "r"), times, label={"scenario": "+1us"})
    doc = _load(Path(write_chrome_trace(out, str(tmp_path / "r.json"))))
    _check_format(doc)
    assert doc["otherData"]["kind"] == "replay" and doc["otherData"]["label"]["scenario"] == "+1us"
    assert doc["baseTimeNanoseconds"] == _store_sql(src, "SELECT min(ts_ns) FROM _events")[0][0] + 1000


def _compare_stores(a_dir, b_dir) -> dict[str, tuple[int, int]]:
    a, b = Store(a_dir), Store(b_dir)
    con = duckdb.connect()
    diffs = {}
    for t in TABLES:
        create_table_view(con, f"a_{t}", a.files(t), TABLES[t])
        create_table_view(con, f"b_{t}", b.files(t), TABLES[t])
    for t in ("events", "gpu_args", "comm_args", "steps", "flows", "memory"):
        q1, q2 = f"SELECT * FROM a_{t}", f"SELECT * FROM b_{t}"
        diffs[t] = (con.execute(f"SELECT count(*) FROM ({q1} EXCEPT ALL {q2})").fetchall()[0][0],
                    con.execute(f"SELECT count(*) FROM ({q2} EXCEPT ALL {q1})").fetchall()[0][0])
    cols = "rank, world_size, backend, event_count, first_ts_ns, last_end_ns, device_properties_json"
    q1, q2 = f"SELECT {cols} FROM a_ranks", f"SELECT {cols} FROM b_ranks"
    diffs["ranks"] = (con.execute(f"SELECT count(*) FROM ({q1} EXCEPT ALL {q2})").fetchall()[0][0],
                      con.execute(f"SELECT count(*) FROM ({q2} EXCEPT ALL {q1})").fetchall()[0][0])
    return diffs


@pytest.mark.slow  # merged Chrome traces of whole runs
def test_rank_files_ingest_back_to_the_same_events(src, tmp_path):
    paths = write_rank_traces(str(src), str(tmp_path / "traces"))
    assert [Path(p).name for p in paths] == [f"rank{r}.trace.json.gz" for r in range(4)]
    doc = _load(Path(paths[1]))
    assert doc["distributedInfo"]["rank"] == 1 and doc["distributedInfo"]["world_size"] == 4
    assert doc["distributedInfo"]["backend"] == "gloo"
    assert doc["baseTimeNanoseconds"] == _store_sql(src, "SELECT base_time_ns FROM _ranks WHERE rank = 1")[0][0]
    pids = {e.get("pid") for e in doc["traceEvents"]}
    assert pids & {r[0] for r in _store_sql(src, "SELECT DISTINCT pid FROM _events WHERE rank = 1")}  # original pids
    back = tmp_path / "back"
    tracekit.open(tmp_path / "traces", store=str(back)).close()
    a, b = Store(src), Store(back)
    con = duckdb.connect()
    create_table_view(con, "a", a.files("events"), TABLES["events"])
    create_table_view(con, "b", b.files("events"), TABLES["events"])
    q1, q2 = "SELECT rank, name, cat, ts_ns, dur_ns FROM a", "SELECT rank, name, cat, ts_ns, dur_ns FROM b"
    assert con.execute(f"SELECT count(*) FROM ({q1} EXCEPT ALL {q2})").fetchall() == [(0,)]
    assert con.execute(f"SELECT count(*) FROM ({q2} EXCEPT ALL {q1})").fetchall() == [(0,)]
    # and everything else too: ids, pids/tids, args, the derived tables
    assert _compare_stores(src, back) == {t: (0, 0) for t in
                                         ("events", "gpu_args", "comm_args", "steps", "flows", "memory", "ranks")}


def test_a_replayed_store_round_trips_through_ingest(tmp_path, tiny_dir):
    """The writer's steps (GPU spans included), flows and memory are what ingest derives from the re-timed trace."""
    src = tmp_path / "s"
    tracekit.open(tiny_dir, store=str(src)).close()
    con = Store(src).connect()
    times = con.sql("""
        SELECT rank, event_id,
               ts_ns + CASE WHEN cat IN ('kernel', 'gpu_memcpy') THEN 9_000 WHEN rank = 1 THEN 3_000 ELSE 0 END AS ts_ns,
               CASE WHEN cat = 'kernel' THEN dur_ns * 3 ELSE dur_ns END AS dur_ns
        FROM _events""").to_arrow_table()
    con.close()
    out = write_retimed_store(str(src), str(tmp_path / "r"), times, label={"scenario": "gpu late"})
    write_rank_traces(out, str(tmp_path / "traces"))
    back = tmp_path / "back"
    tracekit.open(tmp_path / "traces", store=str(back)).close()
    assert _compare_stores(out, back) == {t: (0, 0) for t in
                                         ("events", "gpu_args", "comm_args", "steps", "flows", "memory", "ranks")}
    assert _store_sql(back, "SELECT count(gpu_start_ns) FROM steps")[0][0] == 4
    assert _store_sql(back, "SELECT count(*) FROM memory")[0][0] > 0


@pytest.mark.slow  # merged Chrome traces of whole runs
@pytest.mark.parametrize("rel", ["hta/critical_path/simple_add", "hta/nccl_parser_config"])
def test_shared_gpu_traces_round_trip(rel, tmp_path):
    """Real GPU traces (kernels, memcpys, ac2g flows, collectives; old-style absolute µs times):
    the rank files ingest back to every event and derived row."""
    from .conftest import shared_trace_dir

    d = shared_trace_dir(rel)
    src = tmp_path / "s"
    tracekit.open(d, store=str(src), rank_from="order").close()
    write_rank_traces(str(src), str(tmp_path / "traces"))
    back = tmp_path / "back"
    tracekit.open(tmp_path / "traces", store=str(back)).close()
    assert _compare_stores(src, back) == {t: (0, 0) for t in
                                         ("events", "gpu_args", "comm_args", "steps", "flows", "memory", "ranks")}
    assert _store_sql(back, "SELECT count(*) FROM gpu_args")[0][0] > 0
    doc = _load(Path(write_chrome_trace(str(src), str(tmp_path / "all.json.gz"))))
    _check_format(doc)
    x = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    assert x == _store_sql(src, "SELECT count(*) FROM _events WHERE ph = 'X'")[0][0]
