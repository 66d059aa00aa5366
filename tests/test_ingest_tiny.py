"""Golden checks on tiny traces built in code: every number known by hand."""
from __future__ import annotations

import gzip
import json

import pytest

import tracekit
from tracekit.errors import TracekitError, TraceFileError
from tracekit.ingest import ingest
from tracekit.ingest.kineto import rank_from_filename

from .conftest import tiny_events, write_trace
from .roundtrip import load_source_events, normalise_source, store_events


def _open(d, tmp_path, **kw):
    return tracekit.open(d, store=str(tmp_path / "store"), **kw)


def test_two_ranks_counts_and_views(tiny_dir, tmp_path):
    run = _open(tiny_dir, tmp_path)
    assert run.ranks == [0, 1]
    k = run.sql("SELECT rank, count(*) AS n FROM kernels GROUP BY rank ORDER BY rank")
    assert k["n"].tolist() == [2, 2]
    g = run.sql("SELECT kind, count(*) AS n FROM gpu_ops WHERE rank = 0 GROUP BY kind ORDER BY kind")
    assert dict(zip(g["kind"], g["n"])) == {"kernel": 2, "memcpy": 2}
    # kernel -> launch via correlation, with the step of the launch
    r = run.sql("SELECT step, launch_name, launch_ts_ns, ts_ns, stream, grid FROM kernels WHERE rank = 0 ORDER BY ts_ns")
    assert r["step"].tolist() == [0, 1]
    assert r["launch_name"].tolist() == ["cudaLaunchKernel"] * 2
    assert r["launch_ts_ns"].tolist() == [1_012_000, 1_212_000]
    assert r["ts_ns"].tolist() == [1_020_000, 1_220_000]
    assert r["stream"].tolist() == [7, 7]
    assert json.loads(r["grid"][0]) == [1, 2, 3]
    ops = run.sql("SELECT name, input_dims, input_types, sequence_number, step FROM cpu_ops WHERE rank = 1 ORDER BY ts_ns")
    assert json.loads(ops["input_dims"][0]) == [[4, 4], [4, 4]]
    assert ops["step"].tolist() == [0, 1]


def test_steps_flows_memory_tables(tiny_dir, tmp_path):
    run = _open(tiny_dir, tmp_path)
    s = run.sql("SELECT step, ts_ns, dur_ns, end_ns, gpu_start_ns, gpu_end_ns, is_last FROM steps WHERE rank = 0 ORDER BY step")
    assert s["step"].tolist() == [0, 1]
    assert s["ts_ns"].tolist() == [1_000_000, 1_200_000]
    assert s["dur_ns"].tolist() == [100_000, 100_000]
    # GPU span of step 0: kernel 1020..1050 us, memcpy launched at 1040 runs 1060..1064 us
    assert s["gpu_start_ns"].tolist() == [1_020_000, 1_220_000]
    assert s["gpu_end_ns"].tolist() == [1_064_000, 1_264_000]
    assert s["is_last"].tolist() == [False, True]
    f = run.sql("SELECT cat, flow_id, start_ts_ns, end_ts_ns, start_pid, end_pid FROM flows WHERE rank = 0 ORDER BY flow_id")
    assert f["flow_id"].tolist() == [1, 3]
    assert f["start_ts_ns"].tolist() == [1_012_000, 1_212_000]
    assert f["end_ts_ns"].tolist() == [1_020_000, 1_220_000]
    assert f["end_pid"].tolist() == [0, 0]
    m = run.sql("SELECT ts_ns, addr, bytes, total_allocated, total_reserved, device_type, device_id FROM memory WHERE rank = 0 ORDER BY ts_ns")
    assert m["total_allocated"].tolist() == [64, 128]
    assert m["addr"].tolist() == [4096, 8192]
    assert m["ts_ns"].tolist() == [1_011_000, 1_211_000]


def test_a_step_mirrored_on_the_gpu_is_one_step(tmp_path):
    # Kineto mirrors ProfilerStep#N on the GPU lane (gpu_user_annotation; tracelens/h100_qwen_inference has
    # it): each step was stored twice, and the replay's step join crossed them (a baseline off by 13%)
    ev = tiny_events()
    for e in list(ev):
        if e.get("name", "").startswith("ProfilerStep#"):
            ev.append({**e, "cat": "gpu_user_annotation", "pid": 0, "ts": e["ts"] + 20, "dur": 45})
    write_trace(tmp_path / "run" / "rank0.json", ev, rank=0, world_size=1)
    run = _open(tmp_path / "run", tmp_path)
    s = run.sql("SELECT step, pid, dur_ns, is_last FROM steps ORDER BY step")
    assert s["step"].tolist() == [0, 1] and s["pid"].tolist() == [100, 100]
    assert s["dur_ns"].tolist() == [100_000, 100_000] and s["is_last"].tolist() == [False, True]


def test_old_style_absolute_fractional_timestamps_exact(tmp_path):
    # float64 cannot hold 1669783687464181.123 us to the ns; the store must
    text = (b'{"traceEvents": [\n'
            b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1669783687464181.123, "dur": 2.5},\n'
            b'{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1669783687464182, "dur": 1}\n'
            b'], "distributedInfo": {"rank": 0, "world_size": 1}}')
    d = tmp_path / "t"
    d.mkdir()
    (d / "rank0.json").write_bytes(text)
    run = _open(d, tmp_path)
    r = run.sql("SELECT ts_ns, dur_ns FROM events ORDER BY event_id")
    assert r["ts_ns"].tolist() == [1669783687464181123, 1669783687464182000]
    assert r["dur_ns"].tolist() == [2500, 1000]
    assert run.sql("SELECT time_style FROM ranks")["time_style"][0] == "absolute"


@pytest.mark.parametrize("info_after", [False, True])
def test_new_style_base_time(tmp_path, info_after):
    d = tmp_path / "t"
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 12.345, "dur": 0.001}]
    # baseTimeNanoseconds before traceEvents (as Kineto writes it) or after it
    doc = {"traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000} if info_after else \
        {"baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev}
    doc["distributedInfo"] = {"rank": 0, "world_size": 1}
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(doc))
    run = _open(d, tmp_path)
    r = run.sql("SELECT ts_ns, dur_ns FROM events")
    assert r["ts_ns"].tolist() == [1_700_000_000_000_012_345]
    assert r["dur_ns"].tolist() == [1]
    ranks = run.sql("SELECT time_style, base_time_ns FROM ranks")
    assert ranks["time_style"][0] == "relative" and ranks["base_time_ns"][0] == 1_700_000_000_000_000_000


@pytest.mark.parametrize("name,rank", [("rank-3.json", 3), ("rank3.pt.trace.json", 3), ("worker7.json.gz", 7),
                                       ("job_rank_12.json", 12), ("sampled_rank-0.json.gz", 0),
                                       ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34), ("trace.json", None),
                                       ("megatron_kineto_0.json.gz", None)])
def test_rank_from_filename(name, rank):
    assert rank_from_filename(name) == rank


def test_rank_fallback_to_filename_and_order(tmp_path):
    d = tmp_path / "t"
    write_trace(d / "worker5.json", tiny_events(1), rank=None)
    run = _open(d, tmp_path)
    assert run.ranks == [5]
    assert run.sql("SELECT rank_source FROM ranks")["rank_source"][0] == "filename"
    assert any("rank 5 taken from the file name" in n for n in run.info()["notes"])

    d2 = tmp_path / "u"
    write_trace(d2 / "b.json", tiny_events(1), rank=None)
    write_trace(d2 / "a.json", tiny_events(1), rank=None)
    with pytest.raises(TraceFileError) as e:
        ingest(str(d2), str(tmp_path / "s2"))
    assert ("a.json" in str(e.value) or "b.json" in str(e.value)) and "--rank-from" in str(e.value)
    ingest(str(d2), str(tmp_path / "s2"), rank_from="order")
    run = tracekit.open(str(tmp_path / "s2"))
    assert run.sql("SELECT rank, source_file FROM ranks ORDER BY rank").values.tolist() == [[0, "a.json"], [1, "b.json"]]


def test_duplicate_rank_names_both_files(tmp_path):
    d = tmp_path / "t"
    write_trace(d / "x.json", tiny_events(1), rank=2, world_size=3)
    write_trace(d / "y.json", tiny_events(1), rank=2, world_size=3)
    with pytest.raises(TracekitError) as e:
        ingest(str(d), str(tmp_path / "s"))
    assert "x.json" in str(e.value) and "y.json" in str(e.value) and "rank 2" in str(e.value)
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_truncated_trace_salvages_complete_events(tmp_path):
    d = tmp_path / "t"
    full = write_trace(d / "rank0.json", tiny_events(3), rank=0)
    text = full.read_bytes()
    n_events = len(tiny_events(3))
    # cut in the middle of the 10th event: 9 complete events survive
    starts = [i for i in range(len(text)) if text.startswith(b'\n    {\n      "ph"', i)]
    full.write_bytes(text[: starts[9] + 40])
    r = ingest(str(d), str(tmp_path / "s"), rank_from="filename")
    run = tracekit.open(str(tmp_path / "s"))
    assert run.sql("SELECT count(*) AS n FROM events")["n"][0] == 9
    assert run.sql("SELECT lost_event_count FROM ranks")["lost_event_count"][0] == 1
    assert any("lost 1 incomplete event" in w for w in r.warnings["rank0.json"])
    assert n_events > 10


def test_truncated_gzip_is_salvaged(tmp_path):
    d = tmp_path / "t"
    p = write_trace(d / "rank0.json.gz", tiny_events(50), rank=0)
    raw = gzip.decompress(p.read_bytes())
    p.write_bytes(gzip.compress(raw)[: len(gzip.compress(raw)) * 2 // 3])
    r = ingest(str(d), str(tmp_path / "s"))
    n = tracekit.open(str(tmp_path / "s")).sql("SELECT count(*) AS n FROM events")["n"][0]
    assert 0 < n < len(tiny_events(50))
    w = " ".join(r.warnings["rank0.json.gz"])
    assert "gzip stream ends early" in w and "lost" in w


def test_round_trip_tiny(tiny_dir, tmp_path):
    run = _open(tiny_dir, tmp_path)
    src = [normalise_source(e) for e in load_source_events(tiny_dir / "rank1.trace.json")]
    assert store_events(run, 1) == src


def test_chrome_array_format_and_missing_bracket(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    ev = tiny_events(1)
    (d / "rank0.json").write_text(json.dumps(ev))
    (d / "rank1.json").write_text(json.dumps(ev)[:-1])  # the array format may omit its closing ]
    r = ingest(str(d), str(tmp_path / "s"))
    run = tracekit.open(str(tmp_path / "s"))
    assert run.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank")["n"].tolist() == [len(ev)] * 2
    assert r.warnings == {}


def test_string_pids_and_ids_are_kept(tmp_path):
    d = tmp_path / "t"
    ev = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
           "ts": 5, "dur": 10, "args": {"Op count": 0}},
          {"ph": "s", "id": "0x1f", "pid": 1, "tid": 2, "ts": 6, "cat": "fwdbwd", "name": "fwdbwd"}]
    write_trace(d / "rank0.json", ev, rank=0)
    run = _open(d, tmp_path)
    r = run.sql("SELECT pid, pid_label, tid_label, flow_id, flow_id_label FROM events ORDER BY event_id")
    assert r["pid_label"][0] == "Spans" and r["tid_label"][0] == "PyTorch Profiler"
    assert r["flow_id_label"][1] == "0x1f"


def test_chunked_reading_matches_one_chunk(tmp_path):
    """Cutting the events array into many chunks must not lose or reorder events."""
    from tracekit.ingest.kineto import ingest_kineto

    p = write_trace(tmp_path / "t" / "rank0.json", tiny_events(200), rank=0)
    small = ingest_kineto(str(p), "rank0.json", str(tmp_path / "a"), chunk_bytes=4096)
    big = ingest_kineto(str(p), "rank0.json", str(tmp_path / "b"), chunk_bytes=1 << 30)
    assert len(small.staged["events"]) > 10 and len(big.staged["events"]) == 1
    import duckdb

    q = "SELECT * FROM read_parquet({}) ORDER BY event_id"
    a = duckdb.sql(q.format(small.staged["events"])).fetchall()
    b = duckdb.sql(q.format(big.staged["events"])).fetchall()
    assert a == b and len(a) == len(tiny_events(200))
    assert [r[0] for r in a] == list(range(len(a)))


def test_an_empty_table_orders_its_columns_as_a_full_one(tiny_dir, tmp_path):
    """The tiny run has events but no flight-recorder entries: both tables' views list the schema's
    columns in its order, then rank (hive partitioning appends it), empty or not."""
    import duckdb

    from tracekit.store import create_table_view
    from tracekit.store.schema import TABLES

    run = _open(tiny_dir, tmp_path)
    assert run.sql("SELECT count(*) AS n FROM _fr_entries")["n"].tolist() == [0]
    for table in ("events", "fr_entries"):
        cols = run.sql(f"DESCRIBE _{table}")["column_name"].tolist()
        assert cols == [c for c, _, _ in TABLES[table]] + ["rank"], table
    con = duckdb.connect()
    create_table_view(con, "empty_events", [], TABLES["events"])
    full = run.sql("DESCRIBE _events")
    empty = con.execute("DESCRIBE empty_events").fetchdf()
    assert empty[["column_name", "column_type"]].values.tolist() == full[["column_name", "column_type"]].values.tolist()
