"""Communication across ranks: collectives per rank, matching, skew, transfer, bandwidth, stragglers.

Golden values on tiny multi-rank traces built here; behaviour on the bundled gloo samples (4 ranks, one
injected slow rank) and on the shared real GPU traces (skipped when ../shared is absent)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from analyses import comms
from tracekit.cli import cli

from .conftest import shared_trace_dir, write_trace

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"


# ---------------------------------------------------------------- tiny traces, exact values

def _gloo_rank(arrive_us: float, end_us: float, nelems: int = 1000) -> list[dict]:
    """One step with one gloo all_reduce: the c10d call on the main thread (tid 1), the work on the
    runloop thread (tid 2), as torch records them on gloo."""
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0.0, "dur": 500.0},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 10, "tid": 1, "ts": arrive_us, "dur": 2.0,
         "args": {"External id": 5, "Input Dims": [[[nelems]], [], [], [], [], []],
                  "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 10, "tid": 2, "ts": arrive_us + 1,
         "dur": end_us - arrive_us - 1, "args": {"Input Dims": [[nelems]], "Input type": ["float"]}},
    ]


@pytest.fixture(scope="module")
def gloo3(tmp_path_factory):
    """3 ranks: arrivals 100 / 130 / 110 us, ends 160 / 160 / 161 us, 1000 floats."""
    d = tmp_path_factory.mktemp("gloo3")
    for rank, (a, e) in enumerate([(100, 160), (130, 160), (110, 161)]):
        write_trace(d / f"rank{rank}.json", _gloo_rank(a, e), rank=rank, world_size=3, base_ns=10**18)
    run = tracekit.open(d, store=str(d / "store"))
    yield run
    run.close()


def test_tiny_gloo_rows_and_sizes(gloo3):
    df = comms.collectives(gloo3)
    assert list(df["rank"]) == [0, 1, 2]
    assert set(df["op"]) == {"all_reduce"} and set(df["match_key"]) == {"pg:world:n:1"}
    assert list(df["bytes"]) == [4000] * 3 and set(df["size_source"]) == {"input_dims"}
    assert list(df["dtype"]) == ["float"] * 3 and list(df["timeline"]) == ["cpu"] * 3
    assert list(df["start_ns"] - 10**18) == [100_000, 130_000, 110_000]
    assert list(df["end_ns"] - 10**18) == [160_000, 160_000, 161_000]
    # each runloop takes its collective 1 us after the call (queued_ns); transfer = the last worker start (131)
    # -> first finish (160) = 29 us; the others waited the rest for their peers
    assert list(df["queued_ns"]) == [1_000] * 3
    assert list(df["work_start_ns"] - 10**18) == [101_000, 131_000, 111_000]
    assert list(df["wait_ns"]) == [30_000, 0, 21_000]
    assert list(df["arrival_delay_ns"]) == [0, 30_000, 10_000]
    assert list(df["is_last_arrival"]) == [False, True, False]
    assert df["pg_ranks"].iloc[0] == [0, 1, 2] and set(df["pg_source"]) == {"world"}


def test_op_filter_and_sql_types(gloo3):
    assert len(comms.collectives(gloo3, op="all_reduce")) == 3
    assert comms.collectives(gloo3, op="broadcast").empty
    df = comms.collectives(gloo3)
    assert df["bytes"].dtype.kind == "i" and df["in_nelems"].dtype.kind == "i"  # integers from SQL, not floats
    assert comms.straggler_attribution(gloo3)["avg_delay_ns"].dtype.name in ("int64", "Int64")


def test_comm_participants_columns_are_documented(gloo3):
    from analyses._sql import documented_columns

    df = comms.comm_participants(gloo3, [0, 1, 2])
    assert list(df.columns) == list(documented_columns("comm_participants"))
    assert list(df["rank"]) == [0, 1, 2] and df["runloop_event_id"].notna().all()


def test_tiny_gloo_matched(gloo3):
    m = comms.collectives_matched(gloo3)
    assert len(m) == 1
    r = m.iloc[0]
    assert r["participants"] == [0, 1, 2] and r["complete"] and r["consistent"]
    assert r["arrival_skew_ns"] == 30_000 and r["last_arrival_rank"] == 1 and r["first_arrival_rank"] == 0
    assert r["transfer_ns"] == 29_000 and r["min_dur_ns"] == 30_000
    assert r["algbw_gbps"] == pytest.approx(4000 / 29_000)
    assert r["busbw_gbps"] == pytest.approx(4000 / 29_000 * 2 * 2 / 3)


def test_gloo_collectives_queued_behind_others_count_their_queueing_apart(tmp_path):
    # two ranks call two all-reduces at 100 and 101 us; one runloop thread works on them in turn: 102-202 and
    # 202-302 on both ranks. The second one's transfer is its worker span (100 us), not 201 us from its call;
    # the 101 us it sat in the queue is its queued_ns
    for rank in (0, 1):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0.0, "dur": 500.0}]
        for i, (call, work) in enumerate(((100.0, 102.0), (101.0, 202.0))):
            ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 10, "tid": 1, "ts": call,
                       "dur": 0.5, "args": {"External id": 5 + i, "Input Dims": [[[1000]], [], [], [], [], []],
                                            "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}})
            ev.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 10, "tid": 2, "ts": work,
                       "dur": 100.0, "args": {"Input Dims": [[1000]], "Input type": ["float"]}})
        write_trace(tmp_path / f"rank{rank}.json", ev, rank=rank, world_size=2, base_ns=10**18)
    run = tracekit.open(tmp_path, store=str(tmp_path / "store"))
    df = comms.collectives(run)
    assert sorted(df["queued_ns"]) == [2_000, 2_000, 101_000, 101_000]
    m = comms.collectives_matched(run).sort_values("first_arrival_ns")
    assert list(m["transfer_ns"]) == [100_000, 100_000]
    assert list(m["busbw_gbps"]) == pytest.approx([4000 / 100_000] * 2)
    run.close()


def test_tiny_gloo_stragglers(gloo3):
    s = comms.straggler_attribution(gloo3)
    assert list(s["rank"]) == [1, 0, 2]  # ties in caused wait: by rank
    top = s.iloc[0]
    assert top["late_count"] == 1 and top["avg_delay_ns"] == 30_000 and top["caused_wait_ns"] == 51_000
    assert list(s["wait_ns"]) == [0, 30_000, 21_000]


def _nccl_rank(rank: int, kernel_us: tuple[float, float], seq: int = 7) -> list[dict]:
    """A c10d call with record_param_comms metadata, its launch and its NCCL kernel (new-style args)."""
    meta = {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1 << 20,
            "Out msg nelems": 1 << 20, "Group size": 2, "Process Group Name": "5", "Process Group Description": "tp",
            "Process Group Ranks": "[0, 1]", "Rank": rank, "Seq": seq}
    k0, k1 = kernel_us
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 10, "tid": 1, "ts": 0.0, "dur": 5000.0},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 10, "tid": 1, "ts": 900.0, "dur": 30.0,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 1, "ts": 901.0, "dur": 20.0,
         "args": {"External id": 4, **meta}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 1, "ts": 905.0, "dur": 5.0,
         "args": {"correlation": 77, "cbid": 211}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
         "pid": 0, "tid": 20, "ts": k0, "dur": k1 - k0, "args": {"correlation": 77, "device": 0, "stream": 20, **meta}},
    ]


@pytest.fixture(scope="module")
def nccl2(tmp_path_factory):
    d = tmp_path_factory.mktemp("nccl2")
    write_trace(d / "rank0.json", _nccl_rank(0, (1000.0, 1100.0)), rank=0, world_size=2, base_ns=10**18)
    write_trace(d / "rank1.json", _nccl_rank(1, (1040.0, 1101.0)), rank=1, world_size=2, base_ns=10**18)
    run = tracekit.open(d, store=str(d / "store"))
    yield run
    run.close()


def test_tiny_nccl_metadata_and_bandwidth(nccl2):
    df = comms.collectives(nccl2)
    assert set(df["match_key"]) == {"pg:5:seq:7"} and set(df["match_by"]) == {"seq"}
    assert set(df["size_source"]) == {"args"} and set(df["pg_source"]) == {"args"}
    assert list(df["bytes"]) == [2 * (1 << 20)] * 2 and set(df["pg_desc"]) == {"tp"}
    assert list(df["timeline"]) == ["gpu", "gpu"] and list(df["kernel_count"]) == [1, 1]
    assert list(df["cpu_name"]) == ["c10d::allreduce_"] * 2
    m = comms.collectives_matched(nccl2).iloc[0]
    assert m["transfer_ns"] == 60_000 and m["arrival_skew_ns"] == 40_000 and m["last_arrival_rank"] == 1
    assert m["algbw_gbps"] == pytest.approx(2 * (1 << 20) / 60_000)
    assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"])  # 2(n-1)/n = 1 for two ranks
    assert list(df["wait_ns"]) == [40_000, 1_000]


def test_missing_rank_reported_not_refused(tmp_path):
    """A rank set that lacks a group member (a sampled set) is said so, not refused."""
    d = tmp_path / "r"
    write_trace(d / "rank0.json", _nccl_rank(0, (1000.0, 1100.0)), rank=0, world_size=2, base_ns=10**18)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        m = comms.collectives_matched(run)
        assert m.iloc[0]["ranks_not_traced"] == [1] and not m.iloc[0]["complete"]
        assert m.iloc[0]["participants"] == [0]
        assert "no trace" in m.attrs["note"]



def test_member_traced_without_the_collective_is_missing(tmp_path):
    """A group member with a trace but no row of a collective is in ranks_missing, not ranks_not_traced."""
    d = tmp_path / "r"
    write_trace(d / "rank0.json", _nccl_rank(0, (1000.0, 1100.0)), rank=0, world_size=2, base_ns=10**18)
    write_trace(d / "rank1.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000.0, "dur": 10.0,
                                    "pid": 1, "tid": 1}], rank=1, world_size=2, base_ns=10**18)
    with tracekit.open(d, store=str(tmp_path / "s")) as run:
        m = comms.collectives_matched(run).iloc[0]
        assert m["ranks_missing"] == [1] and m["ranks_not_traced"] == [] and m["participants"] == [0]
        assert not m["complete"]

# ---------------------------------------------------------------- bundled gloo samples

@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    root = tmp_path_factory.mktemp("comms_samples")
    runs = {}

    def get(name):
        if name not in runs:
            runs[name] = tracekit.open(SAMPLES / name, store=str(root / name))
        return runs[name]

    yield get
    for r in runs.values():
        r.close()


def test_loopback_every_collective_matched(samples):
    run = samples("ddp4_loopback")
    manifest = json.loads((SAMPLES / "ddp4_loopback" / "run.json").read_text())
    m = comms.collectives_matched(run)
    assert len(m) >= 3
    assert (m["n_participants"] == 4).all() and m["complete"].all() and m["consistent"].all()
    ar = m[m["op"] == "all_reduce"]
    assert len(ar) == 3  # one gradient bucket per profiled step
    # the gradients are the model: 0.53 M float parameters in one bucket
    assert set(ar["bytes"]) == {manifest["parallel"]["model_bytes"]}
    assert (ar["busbw_gbps"] > 0).all() and (ar["transfer_ns"] > 0).all()


def test_slow_rank_named_and_delay_recovered(samples):
    run = samples("ddp3_slow_rank1")
    s = comms.straggler_attribution(run)
    top = s.iloc[0]
    assert top["rank"] == 1 and top["consistently_late"]
    assert top["avg_delay_ns"] == pytest.approx(40e6, rel=0.15)  # rank 1 sleeps 40 ms per step
    assert not s[s["rank"] != 1]["consistently_late"].any()
    by_step = comms.straggler_attribution(run, by_step=True)
    worst = by_step.sort_values("caused_wait_ns", ascending=False).groupby("step").head(1)
    assert set(worst["rank"]) == {1}  # the worst straggler of every profiled step


def test_cli_stragglers_and_collectives_json(samples, tmp_path):
    run = samples("ddp3_slow_rank1")
    r = CliRunner().invoke(cli, ["comms", "stragglers", str(SAMPLES / "ddp3_slow_rank1"), "--store", run.store.path,
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["rank"] for row in rows][0] == 1 and len(rows) == 3
    for key in ("rank", "late_count", "avg_delay_ns", "caused_wait_ns"):
        assert all(key in row for row in rows)
    assert rows[0]["caused_wait_ns"] >= rows[1]["caused_wait_ns"] >= rows[2]["caused_wait_ns"]
    r = CliRunner().invoke(cli, ["comms", "collectives", str(SAMPLES / "ddp3_slow_rank1"), "--store", run.store.path,
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    for key in ("match_key", "op", "bytes", "participants", "arrival_skew_ns", "transfer_ns", "algbw_gbps", "busbw_gbps"):
        assert all(key in row for row in rows), key
    assert all(row["participants"] == [0, 1, 2] for row in rows)


def test_cli_comms_help_has_examples():
    from tracekit.cli.comms import comms_group

    for name, cmd in comms_group.commands.items():
        r = CliRunner().invoke(cli, ["comms", name, "--help"])
        assert r.exit_code == 0 and "Example:" in r.output, name


def test_cli_bad_input_is_one_line(tmp_path):
    r = CliRunner().invoke(cli, ["comms", "stragglers", str(tmp_path)])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- shared real traces

@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("comms_shared")
    runs = {}

    def get(rel):
        if rel not in runs:
            runs[rel] = tracekit.open(shared_trace_dir(rel), store=str(root / rel.replace("/", "__")))
        return runs[rel]

    yield get
    for r in runs.values():
        r.close()


@pytest.mark.slow  # shared traces
def test_megatron_all_84_allreduces_matched(shared_run):
    run = shared_run("astra-sim/megatron_tp8")
    m = comms.collectives_matched(run)
    gpu = m[m["timeline"] == "gpu"]
    assert len(gpu) == 84 and (gpu["op"] == "all_reduce").all()
    assert (gpu["n_participants"] == 8).all() and gpu["complete"].all() and gpu["consistent"].all()
    # TraceLens on the same trace: transfer (min duration) total 50.1 ms; start skew median 2.8 ms, max 41.7 ms
    assert gpu["min_dur_ns"].sum() == pytest.approx(50.1e6, rel=0.01)
    assert gpu["arrival_skew_ns"].median() == pytest.approx(2.8e6, rel=0.02)
    assert gpu["arrival_skew_ns"].max() == pytest.approx(41.7e6, rel=0.01)
    # sizes recovered from the launching op's Input Dims and the dtype in the kernel name (TraceLens: unknown)
    assert set(gpu["bytes"]) == {4 * 2048 * 4096 * 2, 8192 * 4}
    assert (gpu["busbw_gbps"] > 0).all()
    # the 85th c10d::allreduce_ of every rank launched its kernel after the trace window closed
    assert len(m) == 85 and list(m[m["timeline"] == "none"]["n_participants"]) == [8]


@pytest.mark.slow  # shared traces
def test_megatron_stragglers_are_ranks_0_and_6(shared_run):
    run = shared_run("astra-sim/megatron_tp8")
    s = comms.straggler_attribution(run).set_index("rank")
    assert list(s.index[:2]) == [0, 6]
    assert s.loc[0, "late_count"] == 32 and s.loc[6, "late_count"] == 28  # as TraceLens counts
    assert set(s.index[s["consistently_late"]]) == {0, 6}
    # they wait least (TraceLens: 191 and 214 ms against 363-445 ms for the others)
    assert s.loc[0, "wait_ns"] == pytest.approx(191e6, rel=0.02)
    assert s.loc[6, "wait_ns"] == pytest.approx(214e6, rel=0.02)
    others = s.drop(index=[0, 6])["wait_ns"]
    assert others.min() > 360e6 and others.max() < 450e6
    waits = comms.collectives(run)
    assert len(waits) == 8 * 85 and (waits["wait_ns"].dropna() >= 0).all()


@pytest.mark.slow  # shared traces
def test_nccl_parser_config_metadata(shared_run):
    run = shared_run("hta/nccl_parser_config")
    df = comms.collectives(run)
    gpu = df[df["timeline"] == "gpu"]
    assert len(gpu) == 21 and set(gpu["op"]) == {"all_reduce", "broadcast"}
    assert set(gpu["size_source"]) == {"args"} and set(gpu["pg_name"]) == {"0"}
    assert len(df) == 21  # record_param_comms of a 'wait' is no collective
    assert (gpu["bytes"] == gpu["in_nelems"] * gpu["dtype"].map({"Float": 4, "Long": 8})).all()
    m = comms.collectives_matched(run)
    assert all(v == [1] for v in m["ranks_not_traced"]) and not m["complete"].any()


@pytest.mark.slow  # shared traces
def test_b200_all_gather_bytes_from_args(shared_run):
    run = shared_run("tracelens/b200_eager")
    m = comms.collectives_matched(run)
    ag = m[m["op"] == "all_gather"]
    assert len(ag) == 1
    r = ag.iloc[0]
    assert r["group_size"] == 8 and r["pg_name"] == "3" and r["ranks_not_traced"] == [1, 2, 3, 4, 5, 6, 7]
    rows = comms.collectives(run)
    row = rows[rows["op"] == "all_gather"].iloc[0]
    assert r["bytes"] == max(row["in_nelems"], row["out_nelems"]) * 2  # BFloat16, output buffer


@pytest.mark.slow  # shared traces
def test_sampled_trace_filter_says_so(shared_run):
    run = shared_run("hta/trace_filter")
    m = comms.collectives_matched(run)
    assert len(m) > 0 and not m["complete"].any()
    assert "no trace" in m.attrs.get("note", "")


@pytest.mark.parametrize("name,link_gbps", [("ddp2_2hosts_100mbit", 0.0125), ("ddp4_4hosts_100mbit", 0.0125)])
def test_bandwidth_on_shaped_links_reaches_the_link_rate(samples, name, link_gbps):
    """busbw (nccl-tests factors) of the gradient all-reduce against the tc-shaped link: close to line rate,
    never above it."""
    bw = comms.bandwidth_report(samples(name))
    ar = bw[(bw["op"] == "all_reduce")].iloc[0]
    assert ar["collectives"] == 6 and ar["size_bucket_bytes"] == 1 << 21  # one per profiled step
    assert 0.8 * link_gbps < ar["median_busbw_gbps"] <= 1.02 * link_gbps


@pytest.mark.slow  # shared traces
def test_megatron_bandwidth_reported(shared_run):
    bw = comms.bandwidth_report(shared_run("astra-sim/megatron_tp8"), "all_reduce")
    big = bw[bw["size_bucket_bytes"] == 1 << 26].iloc[0]
    assert big["collectives"] == 81 and big["bytes_total"] == 81 * (1 << 26)
    assert 150 < big["median_busbw_gbps"] < 240  # 8 x A100 NVLink ring: nccl-tests reach ~230 GB/s


def test_every_collective_sized_from_wherever_the_trace_keeps_it(tmp_path):
    # an older NCCL build: record_param_comms alone (no c10d op), no 'In msg nelems', and DDP's TensorList left
    # its Input Dims empty; the nccl:all_reduce annotation right under it has the flat buffer. A broadcast that
    # carries a size nowhere is said to be unsized
    def rank(r):
        meta = {"Collective name": "allreduce", "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                "Process Group Ranks": "[0, 1]", "Rank": r}
        return [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0.0, "dur": 5000.0},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 1, "ts": 900.0, "dur": 20.0,
             "args": {"External id": 4, "Input Dims": [], **meta}},
            {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 10, "tid": 1, "ts": 901.0,
             "dur": 10.0, "args": {"Input Dims": [[1048576]], "Input type": ["float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 1, "ts": 905.0, "dur": 5.0,
             "args": {"correlation": 77, "cbid": 211}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             "pid": 0, "tid": 20, "ts": 1000.0 + 10 * r, "dur": 100.0, "args": {"correlation": 77, "device": 0, "stream": 20}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 1, "ts": 2000.0, "dur": 20.0,
             "args": {"External id": 6, "Input Dims": [], **meta, "Collective name": "broadcast"}},
        ]
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", rank(r), rank=r, world_size=2, base_ns=10**18)
    run = tracekit.open(tmp_path, store=str(tmp_path / "store"))
    df = comms.collectives(run)
    ar = df[df["op"] == "all_reduce"]
    assert list(ar["bytes"]) == [4 * 1048576] * 2 and set(ar["size_source"]) == {"annotation"}
    bc = df[df["op"] == "broadcast"]
    assert bc["bytes"].isna().all() and bc["size_source"].isna().all()
    assert "2 of 4 collective(s) without a size" in df.attrs["note"] and "broadcast" in df.attrs["note"]
    run.close()


def test_a_group_member_list_is_held_once(samples):
    """Rows of one process group share one member list: the views key a row's group by pg_id (one list per
    distinct group), so that no table holds group size x rows integers (world_size^2 for a group of all)."""
    run = samples("ddp4_loopback")
    df = comms.collectives(run)
    assert df.pg_id.nunique() == 1 and df.pg_ranks.iloc[0] == [0, 1, 2, 3]
    assert len({id(v) for v in df.pg_ranks}) == 1
    cp = comms.comm_participants(run, [0, 1, 2, 3])
    assert len(cp) == len(df) and len({id(v) for v in cp.pg_ranks}) == 1
    for table in ("_comm_rows_raw", "_comm_rank_groups", "_comm_pg_config", "_comm_p2p_groups"):
        kinds = run.sql(f"SELECT column_name, column_type FROM (DESCRIBE {table})")
        assert not [c for c, t in zip(kinds.column_name, kinds.column_type) if t.endswith("[]")], table
