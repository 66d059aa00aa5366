"""nccl-tests reference curves and NCCL Inspector logs: parsing the real formats, ingest, the collectives
and bandwidth reports built on them, and bad input failing cleanly."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from analyses import comms
from tracekit.cli import cli
from tracekit.errors import TraceFileError
from tracekit.ingest.nccl import parse_nccl_tests

from .conftest import tiny_events, write_trace

MB8, MB16 = 8388608, 16777216


def nccl_tests_json(path: Path, rows, binary="./build/all_reduce_perf") -> Path:
    """What nccl-tests -J writes (src/util.cu, version 2): root as "%6i" text, doubles as %lf."""
    def body(t, alg, bus):
        return f'{{"time":{t:f},"alg_bw":{alg:f},"bus_bw":{bus:f},"nwrong":{0.0:f}}}'
    results = ",".join(
        f'{{"size":{size},"count":{size // 4},"type":"float","redop":"sum","root":"{-1:6d}",'
        f'"out_of_place":{body(t, size / t / 1e3, bus)},"in_place":{body(t * 1.1, size / t / 1.1e3, bus / 1.1)},'
        f'"actual_iterations":20,"experiment_name":""}}' for size, t, bus in rows)
    path.write_text(f'{{"version":2,"start_time":"2025-01-01 00:00:00","args":["{binary}","-b","8M","-e","16M"],'
                    f'"env":[],"nccl_version":22703,"config":{{"nthreads":1,"ngpus":1}},"results":[{results}],'
                    f'"out_of_bounds":{{"count":0,"okay":"true"}},"errors":[]}}')
    return path


NCCL_TESTS_TEXT = """\
# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703
# Collective test starting: all_gather_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1234 on      node0 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1048576        262144     float    none      -1    50.00   20.97   15.73       0    49.00   21.40   16.05       0
     4194304       1048576     float    none      -1   100.00   41.94   31.46     N/A    98.00   42.80   32.10     N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 23.8
#
# Collective test concluded: all_gather_perf
"""


def test_parse_nccl_tests_json_and_text(tmp_path):
    rows = parse_nccl_tests(str(nccl_tests_json(tmp_path / "ar.json", [(MB8, 400.0, 20.0), (MB16, 800.0, 40.0)])))
    oop = [r for r in rows if not r["in_place"]]
    assert [(r["op"], r["size_bytes"], r["root"], r["busbw_gbps"], r["nwrong"]) for r in oop] == [
        ("all_reduce", MB8, -1, 20.0, 0), ("all_reduce", MB16, -1, 40.0, 0)]
    assert len(rows) == 4 and math.isclose([r for r in rows if r["in_place"]][0]["time_us"], 440.0)

    (tmp_path / "ag.txt").write_text(NCCL_TESTS_TEXT)
    rows = parse_nccl_tests(str(tmp_path / "ag.txt"))
    assert [(r["op"], r["size_bytes"], r["count"], r["dtype"], r["redop"], r["in_place"], r["time_us"],
             r["busbw_gbps"], r["nwrong"]) for r in rows] == [
        ("all_gather", 1048576, 262144, "float", "none", False, 50.0, 15.73, 0),
        ("all_gather", 1048576, 262144, "float", "none", True, 49.0, 16.05, 0),
        ("all_gather", 4194304, 1048576, "float", "none", False, 100.0, 31.46, None),
        ("all_gather", 4194304, 1048576, "float", "none", True, 98.0, 32.10, None)]


def test_parse_nccl_tests_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceFileError, match="results"):
        parse_nccl_tests(str(tmp_path / "x.json"))
    (tmp_path / "y.txt").write_text("hello\n")
    with pytest.raises(TraceFileError, match="result table"):
        parse_nccl_tests(str(tmp_path / "y.txt"))


def inspector_line(comm, rank, n, coll, sn, msg, exec_us, kstart_us=None, host="node0", pid=100):
    """One record as the Inspector plugin writes it (inspector.cc: header, metadata, coll_perf; one per line);
    busbw as inspectorComputeCollBw computes it."""
    traffic = msg * n if coll in ("AllGather", "ReduceScatter") else msg
    factor = {"AllReduce": 2 * (n - 1) / n, "AllGather": (n - 1) / n, "ReduceScatter": (n - 1) / n}.get(coll, 1)
    alg = traffic / 1e9 / (exec_us / 1e6)
    perf = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": msg, "coll_exec_time_us": exec_us,
            "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": alg, "coll_busbw_gbs": alg * factor}
    if kstart_us is not None:
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []}
        perf["event_trace_ts"] = {"coll_start_ts": kstart_us - 5, "coll_stop_ts": kstart_us - 1, "kernel_events": [
            {"channel_id": 0, "kernel_start_ts": kstart_us, "kernel_stop_ts": kstart_us + exec_us,
             "kernel_record_ts": kstart_us + exec_us},
            {"channel_id": 1, "kernel_start_ts": kstart_us + 2, "kernel_stop_ts": kstart_us + exec_us,
             "kernel_record_ts": kstart_us + exec_us}]}
    return json.dumps({"header": {"id": comm, "rank": rank, "n_ranks": n, "nnodes": 1},
                       "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism":
                                    "nccl_profiler_interface", "dump_timestamp_us": 1752867229276385,
                                    "hostname": host, "pid": pid},
                       "coll_perf": perf}, separators=(",", ":"))


# (rank, exec us of sn 1, kernel start / exec us of sn 2, exec us of the all_gather)
INSPECTED = [(0, 1000, 10_000, 600, 100), (1, 1500, 10_100, 500, 100), (2, 1200, 10_050, 550, 100)]


@pytest.fixture
def inspected_dir(tmp_path) -> Path:
    d = tmp_path / "job"
    write_trace(d / "rank0.trace.json", tiny_events(), rank=0, world_size=3)
    insp = d / "nccl-inspector-unknown-jobid"
    insp.mkdir(parents=True)
    for rank, e1, k2, e2, eg in INSPECTED:
        lines = [inspector_line("0x7f8c496ae9f661", rank, 3, "AllReduce", 1, 12_000_000, e1, pid=100 + rank),
                 inspector_line("0x7f8c496ae9f661", rank, 3, "AllReduce", 2, 12_000_000, e2, k2, pid=100 + rank),
                 inspector_line("0x7f8c496ae9f661", rank, 3, "AllGather", 3, 1_000_000, eg, pid=100 + rank)]
        (insp / f"node0-pid{100 + rank}.log").write_text("\n".join(lines) + "\n")
    (d / "train.log").write_text("epoch 1 loss 0.3\n")  # an ordinary log: neither ingested nor reported
    return d


def test_inspector_collectives_matched_exactly(inspected_dir):
    run = tracekit.open(inspected_dir)
    assert run.store.ranks == [0]  # the Inspector logs are no trace ranks
    assert sorted(run.sql("SELECT DISTINCT rank FROM nccl_inspector")["rank"]) == [0, 1, 2]
    m = comms.collectives_matched(run)
    m = m[m["source"] == "nccl_inspector"].set_index("match_key")
    k1, k2, k3 = (f"nccl:0x7f8c496ae9f661:sn:{i}" for i in (1, 2, 3))
    assert list(m.loc[k1, "participants"]) == [0, 1, 2] and bool(m.loc[k1, "complete"])
    # sn 1, no timestamps: transfer = the shortest exec time (1000 us); busbw = 12e6 B / 1 ms x 2(3-1)/3
    assert m.loc[k1, "transfer_ns"] == 1_000_000 and pd_isna(m.loc[k1, "arrival_skew_ns"])
    assert math.isclose(m.loc[k1, "algbw_gbps"], 12.0) and math.isclose(m.loc[k1, "busbw_gbps"], 16.0)
    # sn 2, verbose: arrivals 10_000 / 10_100 / 10_050 us, all end at 10_600 us
    assert m.loc[k2, "arrival_skew_ns"] == 100_000 and m.loc[k2, "last_arrival_rank"] == 1
    assert m.loc[k2, "transfer_ns"] == 500_000 and math.isclose(m.loc[k2, "busbw_gbps"], 32.0)
    # all_gather: per-rank 1 MB -> 3 MB moved; 3e6 B / 100 us = 30 GB/s, x 2/3
    assert m.loc[k3, "bytes"] == 3_000_000 and math.isclose(m.loc[k3, "busbw_gbps"], 20.0)
    per = comms.collectives(run)
    per = per[(per["source"] == "nccl_inspector") & (per["match_key"] == k1)].set_index("rank")
    assert per["wait_ns"].to_dict() == {0: 0, 1: 500_000, 2: 200_000}
    # the plugin's own busbw for the shortest rank agrees with ours
    own = run.sql("SELECT busbw_gbps FROM nccl_inspector WHERE coll_sn = 1 AND rank = 0")["busbw_gbps"].iloc[0]
    assert math.isclose(own, 16.0)


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_bandwidth_against_nccl_tests_reference(inspected_dir, tmp_path):
    ref = nccl_tests_json(tmp_path / "ar.json", [(MB8, 400.0, 20.0), (MB16, 800.0, 40.0)])
    r = CliRunner().invoke(cli, ["ingest", str(inspected_dir), "--nccl-tests", str(ref), "-q"])
    assert r.exit_code == 0, r.output
    run = tracekit.open(inspected_dir)
    assert run.store.ranks == [0]
    assert run.sql("SELECT DISTINCT rank FROM nccl_tests")["rank"].tolist() == [-1]
    b = comms.bandwidth_report(run, "all_reduce")
    row = b[b["source"] == "nccl_inspector"].iloc[0]
    # 12e6 B lies between 8 MiB (20 GB/s) and 16 MiB (40 GB/s): 20 + 20 x log2(12e6 / 8 MiB)
    ref_at = 20 + 20 * math.log2(12_000_000 / MB8)
    assert row["collectives"] == 2 and math.isclose(row["ref_busbw_gbps"], ref_at)
    assert math.isclose(row["busbw_vs_ref_pct"], (100 * 16 / ref_at + 100 * 32 / ref_at) / 2)
    assert row["below_ref_count"] == 0 and not row["ref_extrapolated"]
    strict = comms.bandwidth_report(run, "all_reduce", below_ref_pct=60)
    assert strict[strict["source"] == "nccl_inspector"].iloc[0]["below_ref_count"] == 1  # the 16 GB/s one
    # no all_gather reference: its ref columns stay empty
    ag = comms.bandwidth_report(run, "all_gather").iloc[0]
    assert pd_isna(ag["ref_busbw_gbps"]) and ag["below_ref_count"] == 0
    # a later plain ingest (tracekit.open) keeps the reference
    r = CliRunner().invoke(cli, ["comms", "bandwidth", str(inspected_dir), "--below-ref-pct", "60"])
    assert r.exit_code == 0 and "below reference: 1 all_reduce" in r.output
    assert run.sql("SELECT count(*) AS n FROM nccl_tests")["n"].iloc[0] == 4


def test_bandwidth_without_reference_notes_it(inspected_dir):
    b = comms.bandwidth_report(tracekit.open(inspected_dir))
    assert b["ref_busbw_gbps"].isna().all() and "no nccl-tests reference" in b.attrs["note"]


@pytest.mark.parametrize("content", [None, "not a table\n", '{"results": 3}'])
def test_bad_nccl_tests_file_fails_cleanly(inspected_dir, tmp_path, content):
    CliRunner().invoke(cli, ["ingest", str(inspected_dir), "-q"])
    manifest = (inspected_dir / ".tracekit" / "manifest.json").read_bytes()
    bad = tmp_path / "ref.txt"
    if content is not None:
        bad.write_text(content)
    r = CliRunner().invoke(cli, ["ingest", str(inspected_dir), "--nccl-tests", str(bad)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --nccl-tests {bad}:") and "Traceback" not in r.output
    assert (inspected_dir / ".tracekit" / "manifest.json").read_bytes() == manifest


def test_torn_last_inspector_line_is_tolerated_but_garbage_is_not(inspected_dir):
    log = inspected_dir / "nccl-inspector-unknown-jobid" / "node0-pid100.log"
    log.write_text(log.read_text() + '{"header": {"id": "0x7f')  # the plugin was still writing
    assert len(tracekit.open(inspected_dir).sql("SELECT * FROM nccl_inspector WHERE rank = 0")) == 3
    lines = log.read_text().splitlines()
    lines[1] = lines[1].replace('"coll_perf"', '"oops"')  # (a bad first line: not an Inspector log at all)
    log.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(cli, ["ingest", str(inspected_dir)])
    assert r.exit_code == 2 and "node0-pid100.log" in r.output and "Inspector record" in r.output


def test_ingest_help_has_example():
    r = CliRunner().invoke(cli, ["ingest", "--help"])
    assert "--nccl-tests" in r.output and "Example:" in r.output
