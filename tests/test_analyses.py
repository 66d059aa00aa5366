"""Golden tests of the analyses on tiny traces built here, where every figure is
worked out by hand in the comments; plus the registry, documentation and CLI contracts."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import analyses
import tracekit
from analyses.registry import REGISTRY
from tracekit.cli import cli
from tracekit.errors import TracekitError

T0 = 1_000_000.0  # us; old-style absolute timestamps
US = 1000  # ns per us


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args}


def _launch(corr, ts, dur, name="cudaLaunchKernel"):
    return _x("cuda_runtime", name, ts, dur, **{"correlation": corr, "External id": corr})


def _gpu(corr, name, ts, dur, stream=7, cat="kernel"):
    return _x(cat, name, ts, dur, pid=0, tid=stream, **{"correlation": corr, "External id": corr, "stream": stream,
                                                        "device": 0})


def _write(path, events, rank=0):
    path.mkdir(parents=True, exist_ok=True)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Tiny GPU"}],
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 1},
           "traceEvents": events}
    (path / f"rank{rank}.json").write_text(json.dumps(doc))
    return path


# Two steps on rank 0. GPU ops (us after T0), launched by the calls at the given times:
#   corr 1 gemm_a            stream 7  [10, 30)   compute        launch at 1
#   corr 2 ncclDevKernel_... stream 20 [20, 50)   communication  launch at 6
#   corr 3 gemm_b            stream 7  [45, 55)   compute        launch at 40
#   corr 4 Memcpy DtoD       stream 7  [56, 60)   memory         launch at 50
#   corr 5 triton_poi_...    stream 7  [100, 110) compute        launch at 60 (step 1)
#   corr 6 __amd_rocclr_copy stream 7  [130, 140) memory         launch at 120 (step 2)
GPU_EVENTS = [
    _x("user_annotation", "ProfilerStep#1", 0, 100),
    _x("user_annotation", "ProfilerStep#2", 100, 100),
    _x("cpu_op", "aten::mm", 0.5, 5, **{"External id": 1}),
    _launch(1, 1, 4), _launch(2, 6, 4), _launch(3, 40, 4), _launch(4, 50, 2, "cudaMemcpyAsync"),
    _launch(5, 60, 4), _launch(6, 120, 5),
    _gpu(1, "gemm_a", 10, 20),
    _gpu(2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, 30, stream=20),
    _gpu(3, "gemm_b", 45, 10),
    _gpu(4, "Memcpy DtoD (Device -> Device)", 56, 4, cat="gpu_memcpy"),
    _gpu(5, "triton_poi_fused_add_0", 100, 10),
    _gpu(6, "__amd_rocclr_copyBuffer", 130, 10),
]

# CPU only: aten::add [0, 10), c10d::allreduce_ [20, 50) on the main thread, gloo:all_reduce [25, 45)
# on the gloo thread: span 50, busy 10 + 30 = 40, idle 10, compute 10 (aten::add), non-compute 30.
CPU_EVENTS = [
    _x("user_annotation", "ProfilerStep#1", 0, 100),
    _x("cpu_op", "aten::add", 0, 10),
    _x("cpu_op", "c10d::allreduce_", 20, 30),
    _x("user_annotation", "gloo:all_reduce", 25, 20, tid=2),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return tracekit.open(_write(d / "trace", GPU_EVENTS), store=str(d / "store"))


@pytest.fixture(scope="module")
def tiny_cpu(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_cpu")
    _write(d / "trace", CPU_EVENTS)
    return tracekit.open(d / "trace", store=str(d / "store"))


def _row(df, **where):
    for k, v in where.items():
        df = df[df[k].isna()] if v is None else df[df[k] == v]
    assert len(df) == 1, df
    return df.iloc[0]


def test_temporal_breakdown_whole_trace(tiny):
    # span [10, 140) = 130; union of all ops [10,55) [56,60) [100,110) [130,140) = 45+4+10+10 = 69
    # compute union [10,30) [45,55) [100,110) = 40; idle 130-69 = 61; non-compute 69-40 = 29
    r = _row(analyses.temporal_breakdown(tiny), rank=0)
    assert (r.kernel_span_ns, r.busy_ns, r.idle_ns, r.compute_ns, r.non_compute_ns) == (
        130 * US, 69 * US, 61 * US, 40 * US, 29 * US)
    assert r.idle_pct == pytest.approx(100 * 61 / 130)
    assert r.compute_pct == pytest.approx(100 * 40 / 130)
    assert r.non_compute_pct == pytest.approx(100 * 29 / 130)
    assert r.timeline == "gpu"


def test_temporal_breakdown_by_step_and_hta_scope(tiny):
    df = analyses.temporal_breakdown(tiny, by_step=True)
    s1, s2 = _row(df, step=1), _row(df, step=2)
    # step 1: ops 1-5, span [10,110) = 100, busy 45+4+10 = 59, compute 40
    assert (s1.kernel_span_ns, s1.idle_ns, s1.compute_ns, s1.non_compute_ns) == (100 * US, 41 * US, 40 * US, 19 * US)
    # step 2: the rocclr copy alone: memory, so all non-compute
    assert (s2.kernel_span_ns, s2.idle_ns, s2.compute_ns, s2.non_compute_ns) == (10 * US, 0, 0, 10 * US)
    hta_scope = _row(analyses.temporal_breakdown(tiny, drop_last_step=True), rank=0)
    assert (hta_scope.kernel_span_ns, hta_scope.idle_ns, hta_scope.compute_ns) == (100 * US, 41 * US, 40 * US)
    only_2 = analyses.temporal_breakdown(tiny, step=2)
    assert list(only_2.step) == [2] and only_2.compute_ns.iloc[0] == 0


def test_comm_comp_overlap(tiny):
    # comm [20,50) = 30; compute under it [20,30) and [45,50) = 15 -> 50 %, exposed 15
    r = _row(analyses.comm_comp_overlap(tiny), rank=0)
    assert (r.comm_ns, r.overlap_ns, r.exposed_comm_ns, r.compute_ns) == (30 * US, 15 * US, 15 * US, 40 * US)
    assert r.overlap_pct == pytest.approx(50.0)
    s2 = _row(analyses.comm_comp_overlap(tiny, by_step=True), step=2)
    assert s2.comm_ns == 0 and s2.overlap_pct != s2.overlap_pct  # NaN: no communication in step 2


def test_idle_time_breakdown(tiny):
    # stream 7 gaps: 30->45 launch 40 > 30 host_wait 15; 55->56 launch 50 kernel_wait 1;
    # 60->100 launch 60 not after 60, 40 >= 30 us: other 40; 110->130 launch 120 host_wait 20
    df = analyses.idle_time_breakdown(tiny)
    s7 = _row(df, stream=7)
    assert (s7.idle_ns, s7.host_wait_ns, s7.kernel_wait_ns, s7.other_idle_ns) == (76 * US, 35 * US, 1 * US, 40 * US)
    assert s7.host_wait_pct == pytest.approx(100 * 35 / 76)
    assert _row(df, stream=20).idle_ns == 0
    # a 50 us threshold turns the 40 us gap into kernel wait
    s7 = _row(analyses.idle_time_breakdown(tiny, kernel_wait_threshold_ns=50_000), stream=7)
    assert (s7.kernel_wait_ns, s7.other_idle_ns) == (41 * US, 0)


def test_kernel_classification_defaults():
    c = analyses.classify
    assert c("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)") == "communication"
    assert c("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "communication"
    assert c("rcclGenericKernel") == "communication"
    assert c("cross_device_reduce_1stage<__nv_bfloat16, 8>") == "communication"
    assert c("Memcpy HtoD (Pageable -> Device)") == "memory"
    assert c("hipMemcpyDtoD_kernel") == "memory"  # HTA's old ^hip rule says communication
    assert c("__amd_rocclr_copyBuffer") == "memory"
    assert c("triton_poi_fused_add_0") == "compute"
    assert c("volta_sgemm_128x64_nn") == "compute"
    assert c("my_allreduce", rules=[("communication", "^my_allreduce")]) == "communication"


def test_kernel_classification_analysis_and_override(tiny, tmp_path):
    df = analyses.kernel_classification(tiny)
    classes = dict(zip(df.name, df.kernel_class))
    assert classes["gemm_a"] == "compute" and classes["__amd_rocclr_copyBuffer"] == "memory"
    assert classes["triton_poi_fused_add_0"] == "compute"
    assert [n for n, k in classes.items() if k == "communication"][0].startswith("ncclDevKernel")
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nclass = "communication"\npattern = "^gemm_b$"\n')
    df = analyses.kernel_classification(tiny, rules=str(rules))
    assert _row(df, name="gemm_b").kernel_class == "communication"
    assert _row(df, name="gemm_b").rule_pattern == "^gemm_b$"
    # the override flows into every analysis: gemm_b [45,55) is now communication -> comm 30 + 5 = 35
    r = _row(analyses.comm_comp_overlap(tiny, rules=[("communication", "^gemm_b$")]), rank=0)
    assert (r.comm_ns, r.compute_ns, r.overlap_ns) == (35 * US, 30 * US, 10 * US)
    with pytest.raises(TracekitError, match="class"):
        analyses.kernel_classification(tiny, rules=[("network", "x")])


def test_kernel_breakdown(tiny):
    df = analyses.kernel_breakdown(tiny, by_class=True)
    mem = _row(df, kernel_class="memory")
    assert (mem.kernel_count, mem.total_ns, mem.min_ns, mem.max_ns) == (2, 14 * US, 4 * US, 10 * US)
    assert mem.rank_pct == pytest.approx(100 * 14 / 84)
    df = analyses.kernel_breakdown(tiny, top_k=1)
    comp = df[df.kernel_class == "compute"]
    assert list(comp.name) == ["gemm_a", "others"]  # gemm_a 20 us beats gemm_b and triton (10 us each)
    others = _row(comp, name="others")
    assert (others.kernel_count, others.total_ns, others.mean_ns, others.p50_ns) == (2, 20 * US, 10 * US, 10 * US)
    assert _row(comp, name="gemm_a").class_pct == pytest.approx(50.0)


def test_cpu_only_trace(tiny_cpu):
    r = _row(analyses.temporal_breakdown(tiny_cpu), rank=0)
    assert r.timeline == "cpu"
    assert (r.kernel_span_ns, r.idle_ns, r.compute_ns, r.non_compute_ns) == (50 * US, 10 * US, 10 * US, 30 * US)
    o = _row(analyses.comm_comp_overlap(tiny_cpu), rank=0)
    assert (o.comm_ns, o.overlap_ns) == (30 * US, 0)
    for name in ("idle_time_breakdown", "kernel_breakdown", "kernel_classification"):
        df = tiny_cpu.analyze(name)
        assert df.empty and df.attrs["note"] == "no GPU activity in this trace"


def test_bad_scope_is_a_clear_error(tiny):
    with pytest.raises(TracekitError, match="--rank 3"):
        analyses.temporal_breakdown(tiny, rank=3)
    with pytest.raises(TracekitError, match="--step 9"):
        tiny.analyze("kernel_breakdown", step=9)
    with pytest.raises(TracekitError, match="no such analysis"):
        tiny.analyze("flame_graph")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_output_column_is_documented(tiny, name):
    a = REGISTRY[name]
    if a.needs_other_run:
        df = a.func(tiny, other=tiny)
    else:
        df = a.func(tiny)
    documented = a.columns
    assert documented, f"{name} documents no column"
    assert list(df.columns) == list(documented), f"{name}: columns differ from its .sql documentation"


def test_registry_names_are_snake_case_and_listed():
    result = CliRunner().invoke(cli, ["analyze", "--list", "--format", "csv"])
    assert result.exit_code == 0
    listed = [line.split(",")[0] for line in result.output.strip().splitlines()[1:]]
    assert listed == list(REGISTRY)
    assert all(n.islower() and n.replace("_", "").isalnum() for n in listed)


def test_cli_json_stable_columns(tiny):
    d = tiny.trace_dir
    store = tiny.store.path
    out = CliRunner().invoke(cli, ["analyze", "temporal_breakdown", d, "--store", store, "--format", "json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)[0]
    for col in ("rank", "idle_ns", "compute_ns", "non_compute_ns", "kernel_span_ns", "idle_pct", "compute_pct",
                "non_compute_pct"):
        assert col in row
    assert row["idle_ns"] == 61 * US
    out = CliRunner().invoke(cli, ["analyze", "comm_comp_overlap", d, "--store", store, "--format", "json"])
    row = json.loads(out.output)[0]
    assert {k: row[k] for k in ("rank", "comm_ns", "overlap_ns", "overlap_pct", "exposed_comm_ns")} == {
        "rank": 0, "comm_ns": 30 * US, "overlap_ns": 15 * US, "overlap_pct": 50.0, "exposed_comm_ns": 15 * US}


@pytest.mark.parametrize("args,needle", [
    (["nope"], "NAME 'nope'"),
    (["temporal_breakdown", "--rank", "7"], "--rank 7"),
    (["temporal_breakdown", "--step", "42"], "--step 42"),
    (["idle_time_breakdown", "-p", "bogus=1"], "--param"),
    (["idle_time_breakdown", "-p", "kernel_wait_threshold_ns=abc"], "expected int"),
    # the library's parameter check (registry.check_params), naming the option that gave the parameter
    (["temporal_breakdown", "--top-k", "3"], "temporal_breakdown: unknown parameter(s) --top-k; it takes rank,"),
    (["temporal_breakdown", "-p", "bogus=1"], "unknown parameter(s) --param bogus"),
    (["temporal_breakdown", "-p", "bogus"], "--param 'bogus': expected KEY=VALUE"),
])
def test_cli_bad_input_exits_2(tiny, args, needle):
    out = CliRunner().invoke(cli, ["analyze", args[0], tiny.trace_dir, "--store", tiny.store.path, *args[1:]])
    assert out.exit_code == 2
    assert needle in out.output


def test_cli_param_and_note(tiny, tiny_cpu):
    out = CliRunner().invoke(cli, ["analyze", "idle_time_breakdown", tiny.trace_dir, "--store", tiny.store.path,
                                   "-p", "kernel_wait_threshold_ns=50000", "--format", "json"])
    s7 = [r for r in json.loads(out.output) if r["stream"] == 7][0]
    assert s7["kernel_wait_ns"] == 41 * US
    out = CliRunner().invoke(cli, ["analyze", "kernel_breakdown", tiny_cpu.trace_dir, "--store", tiny_cpu.store.path])
    assert out.exit_code == 0 and "no GPU activity in this trace" in out.output


def test_analyze_help_has_example():
    out = CliRunner().invoke(cli, ["analyze", "--help"])
    assert out.exit_code == 0 and "Example:" in out.output


def test_kernel_launch_stats_and_outliers(tiny):
    # delays (op start - launch end): gemm_a 10-5=5, nccl 20-10=10, gemm_b 45-44=1, triton 100-64=36,
    # rocclr 130-125=5 (cudaLaunchKernel); memcpy 56-52=4 (cudaMemcpyAsync)
    df = analyses.kernel_launch_stats(tiny, launch_delay_cutoff_ns=20_000, runtime_cutoff_ns=4_500)
    k = _row(df, launch_name="cudaLaunchKernel")
    assert (k.op_count, k.launch_delay_max_ns, k.launch_delay_p50_ns) == (5, 36 * US, 5 * US)
    assert k.launch_delay_mean_ns == pytest.approx(57 / 5 * US)
    assert (k.long_launch_delay_count, k.long_runtime_call_count, k.short_op_long_launch_count) == (1, 1, 0)
    assert _row(df, launch_name="cudaMemcpyAsync").launch_delay_max_ns == 4 * US
    out = analyses.kernel_launch_outliers(tiny, launch_delay_cutoff_ns=20_000, runtime_cutoff_ns=4_500)
    assert list(out.name) == ["triton_poi_fused_add_0", "__amd_rocclr_copyBuffer"]


def test_queue_length(tiny):
    # stream 7: launches at 1, 40, 50, 60, 120 and starts at 10, 45, 56, 100, 130: never more than one
    # queued; queued for 9 + 5 + 6 + 40 + 10 = 70 of the 129 us between the first and last change
    q = analyses.queue_length(tiny)
    s7 = q[q.stream == 7]
    assert list(s7.queue_length) == [1, 0] * 5
    summary = _row(analyses.queue_length_summary(tiny), stream=7)
    assert (summary.max_queue_length, summary.span_ns) == (1, 129 * US)
    assert summary.mean_queue_length == pytest.approx(70 / 129)
    assert _row(analyses.queue_length_summary(tiny, queue_limit=1), stream=7).full_queue_ns == 70 * US


def test_memory_bandwidth_and_timeline(tiny, tiny_cpu):
    s = _row(analyses.memory_bandwidth_summary(tiny), direction="DtoD")
    assert (s.copy_count, s.total_ns) == (1, 4 * US)
    series = analyses.memory_bandwidth(tiny)
    assert list(series.in_flight) == [1, 0] and list(series.ts_ns.diff().dropna()) == [4 * US]
    assert analyses.memory_timeline(tiny).attrs["note"].startswith("no [memory] events")


def test_gpu_time_by_cpu_op_and_sequences(tiny):
    df = analyses.gpu_time_by_cpu_op(tiny)
    # aten::mm (External id 1, [0.5, 5.5)) launched gemm_a (20 us) and encloses its launch at 1 us
    for level in ("innermost", "top"):
        mm = _row(df, level=level, op_name="aten::mm")
        assert (mm.kernel_count, mm.gpu_time_ns, mm.op_count) == (1, 20 * US, 1)
        assert _row(df, level=level, op_name="(no op)").gpu_time_ns == 64 * US
    seq = analyses.kernel_sequences(tiny, operator="aten::mm", length=1)
    assert list(seq.sequence) == ["gemm_a"] and seq.occurrences.iloc[0] == 1
    ann = analyses.gpu_time_by_annotation(tiny)
    assert list(ann.annotation) == ["(unannotated)"] and ann.attrs["note"].startswith("no gpu_user_annotation")


def test_trace_diff(tiny, tmp_path):
    # the other run: gemm_b twice as long (10 -> 20 us), the rocclr copy gone, a new kernel
    events = [e for e in GPU_EVENTS if e["name"] != "__amd_rocclr_copyBuffer"]
    events = [dict(e, dur=20) if e["name"] == "gemm_b" else e for e in events] + [_gpu(9, "new_kernel", 150, 3)]
    other = tracekit.open(_write(tmp_path / "other", events), store=str(tmp_path / "store"))
    df = analyses.trace_diff(tiny, other)
    gemm_b = _row(df, name="gemm_b")
    assert (gemm_b.status, gemm_b.total_delta_ns, gemm_b.mean_change_pct) == ("slower", 10 * US, 100.0)
    assert _row(df, name="__amd_rocclr_copyBuffer").status == "removed"
    assert _row(df, name="new_kernel").status == "added"
    assert _row(df, name="gemm_a").status == "same"
    assert df.name.iloc[0] in ("gemm_b", "__amd_rocclr_copyBuffer")  # largest |delta| (10 us) first
    out = CliRunner().invoke(cli, ["analyze", "trace_diff", tiny.trace_dir, "--store", tiny.store.path,
                                   "--against", other.trace_dir, "--against-store", other.store.path,
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    assert {r["name"]: r["status"] for r in json.loads(out.output)}["new_kernel"] == "added"


def test_critical_path_by_hand(tiny, tmp_path):
    # step 1 ends with triton [100, 110); its stream was free at 60 when L5 began: launch-bound.
    # Back from there along the CPU thread: calls L1 [1,5) L2 [6,10) L3 [40,44) L4 [50,52) L5 [60,64)
    # cpu: 0->1, 5->6, 10->40, 44->50, 52->60 = 1+1+30+6+8 = 46
    # launch_overhead: L1..L4 durations 4+4+4+2 = 14, plus L5 start -> triton start 40 = 54
    # compute: triton 10; path = 110 us, the step start to the last op's end
    overlay = tmp_path / "cp.json"
    path = analyses.critical_path(tiny, rank=0, step=1, overlay_path=str(overlay))
    assert path.dur_ns.sum() == 110 * US
    summary = analyses.critical_path_summary(tiny, rank=0, step=1).set_index("category")
    assert summary.path_ns.to_dict() == {"launch_overhead": 54 * US, "cpu": 46 * US, "compute": 10 * US}
    assert summary.path_pct.sum() == pytest.approx(100.0)
    trace = json.loads(overlay.read_text())
    assert {e["tid"] for e in trace["traceEvents"]} == {"cpu", "launch_overhead", "compute"}
    assert analyses.critical_path(tiny).step.iloc[0] == 1  # default: the first complete step


def test_critical_predecessor_is_the_later_dependency():
    import numpy as np
    import pandas as pd

    from analyses.depgraph import E, K, Graph
    from analyses.depgraph.lags import critical_edges

    def graph(prev_op_end):
        # node 0 origin at t=0; 1 a launch call at t=5; 2 the stream's previous op [2, prev_op_end); 3 the
        # launched op at t=10, after both the launch's start and the previous op's end
        i64 = lambda v: np.array(v, np.int64)  # noqa: E731
        return Graph(kind=np.array([K["origin"], K["runtime"], K["gpu"], K["gpu"]], np.int8), rank=i64([-1, 0, 0, 0]),
                     track=i64([-1, 0, 1, 1]), event_id=i64([-1, 1, 2, 3]), start_ns=i64([0, 5, 2, 10]),
                     dur_ns=i64([0, 1, prev_op_end - 2, 1]), coll=i64([-1] * 4), name=np.array(["o", "l", "a", "b"], object),
                     src=i64([0, 0, 1, 2]), dst=i64([1, 2, 3, 3]), from_end=np.array([True, True, False, True]),
                     edge_kind=np.array([E["origin"], E["origin"], E["launch"], E["stream"]], np.int8),
                     lag_ns=i64([0] * 4), tracks=pd.DataFrame(), colls=pd.DataFrame(), steps=pd.DataFrame(), ranks=[0],
                     origin_ns=0)

    assert critical_edges(graph(8)).tolist() == [-1, 0, 1, 3]  # the previous op ended later: the stream
    assert critical_edges(graph(4)).tolist() == [-1, 0, 1, 2]  # the launch began later
    assert critical_edges(graph(5)).tolist() == [-1, 0, 1, 2]  # a tie goes to the launch


def test_the_library_checks_parameters_as_the_cli_does(tiny):
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match=r"temporal_breakdown: unknown parameter\(s\) top_k; it takes rank,"):
        tiny.analyze("temporal_breakdown", top_k=3)
