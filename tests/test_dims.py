"""replay/dims: the layout a trace shows, judged against run.json's truth with run.json left out (the bundled layout
samples), on the shared real traces (Megatron TP 8 without group names, vLLM's 71 unnamed groups), and on tiny
traces built in code whose process groups name the dimensions (or contradict each other)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tracekit
from analyses import depgraph
from replay.dims import TraceLayout, _dim_of_desc, coll_dims, trace_layout
from replay.memory import op_facts
from tracekit.errors import TracekitError

from .conftest import REPO, shared_trace_dir, tiny_events, write_trace

LAYOUTS = REPO / "sample_traces" / "layouts"
SAMPLES = ([LAYOUTS / p.name for p in sorted(LAYOUTS.iterdir()) if (p / "run.json").exists()]
           if LAYOUTS.is_dir() else []) + [REPO / "sample_traces" / "ddp2_2hosts_100mbit"]


def _layout(path, store, **kw):
    run = tracekit.open(path, store=str(store))
    g = depgraph.build(run)
    act = op_facts(run, g).coll_act
    return run, g, act, trace_layout(run, g, act, **kw)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    base = tmp_path_factory.mktemp("dims")
    return {p.name: _layout(p, base / p.name, cross_check=False) for p in SAMPLES}


def test_every_bundled_layout_sample_is_told_by_its_trace(samples):
    assert len(samples) >= 11
    for name, (run, g, act, lay) in samples.items():
        par = run.run_manifest()["parallel"]
        got = (lay.world, lay.dp, lay.tp, lay.pp, lay.micro_batches, lay.sharding)
        truth = (run.run_manifest()["world_size"], par["dp"], par["tp"], par["pp"], par["micro_batches"],
                 par.get("sharding", "none"))
        assert got == truth, (name, got, truth, lay.evidence)
        assert lay.source == "trace"
        # the schedule the recorder ran: GPipe for pp_gpipe and dp_pp, 1F1B for pp_1f1b
        layout = par.get("layout", "ddp")
        assert lay.schedule == {"pp_gpipe": "gpipe", "dp_pp": "gpipe", "pp_1f1b": "1f1b"}.get(layout), name
        # every degree above 1 says what told it
        for d in ("dp", "tp", "pp"):
            if getattr(lay, d) > 1:
                assert any(e.startswith(f"{d} = {getattr(lay, d)}:") for e in lay.evidence), (name, lay.evidence)


def test_the_cross_check_agrees_on_the_samples(samples):
    for name, (run, g, act, lay) in samples.items():
        full = trace_layout(run, g, act)
        assert not any("disagrees" in e for e in full.evidence), (name, full.evidence)


def test_each_collective_takes_its_dimension(samples):
    _, g, act, lay = samples["dp_pp_2hosts_100mbit"]
    dims = coll_dims(g, lay, act)
    p2p = g.colls.op.isin(["send", "recv"]).to_numpy()
    assert (dims[p2p] == "pp").all() and (dims[~p2p] == "dp").all()
    assert lay.groups["pp"] == [[0, 1], [2, 3]] and lay.groups["dp"] == [[0, 2], [1, 3]]
    _, g, act, lay = samples["fsdp_2hosts_100mbit"]
    assert (coll_dims(g, lay, act) == "dp").all()
    assert any("FSDP::all_gather" in e for e in lay.evidence)
    _run, g, act, lay = samples["tp_sp_2hosts_100mbit"]
    assert (coll_dims(g, lay, act) == "tp").all()  # the norms' small gradient all-reduces are the tp group's too


def test_the_pipelines_stages_in_order_and_its_micro_batches(samples):
    _run, _g, _act, lay = samples["pp_1f1b_2hosts_100mbit"]
    assert lay.groups["pp"] == [[0, 1]] and any(e.startswith("micro_batches = 4:") for e in lay.evidence)


# ----------------------------------------------------------------------------------------- shared real traces

@pytest.mark.slow  # shared traces
def test_megatron_tp8_is_tensor_parallel_8(tmp_path):
    _run, g, act, lay = _layout(shared_trace_dir("astra-sim/megatron_tp8"), tmp_path / "s")
    assert (lay.world, lay.tp, lay.dp, lay.pp, lay.sharding) == (8, 8, 1, 1, "none")
    # distributedInfo has no pg_config: the 84 all-reduces of [2048, 4, 4096] activations told it
    assert any(e.startswith("tp = 8: 84 all_reduce carrying the step's tokens") for e in lay.evidence)
    assert (coll_dims(g, lay, act) == "tp").all()


@pytest.mark.slow  # shared traces
def test_b200_eagers_71_unnamed_groups_name_no_dimension(tmp_path):
    path = shared_trace_dir("tracelens/b200_eager")
    run, _g, _act, lay = _layout(path, tmp_path / "s")
    # what its pg_config holds (rank 0's 15 of 71 groups): default_pg, and 14 'undefined' groups of size 8 or 1
    info = json.loads(run.sql("SELECT distributed_info_json FROM ranks").distributed_info_json.iat[0])
    cfg = info["pg_config"]
    assert info["pg_count"] == 71 and len(cfg) == 15
    assert {p["pg_desc"] for p in cfg} == {"default_pg", "undefined"} and {p["pg_size"] for p in cfg} == {1, 8}
    assert lay.pg_dims == {} and any("pg_count 71" in e for e in lay.evidence)
    # vLLM's tensor_model_parallel_all_gather of the logits ([1, 25136] a rank) is its one NCCL collective
    assert (lay.world, lay.tp, lay.dp, lay.pp) == (8, 8, 1, 1)
    assert lay.groups == {"tp": [list(range(8))]}


# ------------------------------------------------------------------------------------------ tiny traces in code

def _tiny(tmp_path, world: int, pg_config: list[dict] | None):
    d = tmp_path / "run"
    for r in range(world):
        write_trace(d / f"rank{r}.trace.json", tiny_events(t0_us=1000.0 + r), rank=r, world_size=world,
                    pg_config=pg_config)
    return _layout(d, tmp_path / "store")


def _groups(desc: str, *ranks, start: int = 1) -> list[dict]:
    return [{"pg_name": str(start + i), "pg_desc": desc, "ranks": list(r)} for i, r in enumerate(ranks)]


def test_contradictory_groups_raise_one_line(tmp_path):
    cfg = ([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]}]
           + _groups("TENSOR_MODEL_PARALLEL_GROUP", [0, 1], [2, 3], start=1)
           + _groups("PIPELINE_MODEL_PARALLEL_GROUP", [0, 2], [1, 3], start=3)
           + _groups("DATA_PARALLEL_GROUP", [0, 1], [2, 3], start=5))
    with pytest.raises(TracekitError) as e:
        _tiny(tmp_path, 4, cfg)
    msg = str(e.value)
    assert "\n" not in msg and "dp 2 x tp 2 x pp 2 x cp 1 = 8 ranks, its world size is 4" in msg


def test_named_tensor_groups_leave_the_rest_to_data_parallelism(tmp_path):
    cfg = ([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]}]
           + _groups("TENSOR_MODEL_PARALLEL_GROUP", [0, 1], [2, 3]))
    _run, _g, _act, lay = _tiny(tmp_path, 4, cfg)
    assert (lay.dp, lay.tp, lay.pp) == (2, 2, 1)
    assert lay.groups["tp"] == [[0, 1], [2, 3]] and lay.groups["dp"] == [[0, 2], [1, 3]]
    assert lay.pg_dims == {"1": "tp", "2": "tp"}
    assert any(e.startswith("dp = 2: the rest of the world") for e in lay.evidence)


def test_one_rank_is_a_layout_of_one(tmp_path):
    _run, g, act, lay = _tiny(tmp_path, 1, None)
    assert (lay.world, lay.dp, lay.tp, lay.pp, lay.micro_batches, lay.schedule) == (1, 1, 1, 1, 1, None)
    assert isinstance(lay, TraceLayout) and lay.sharding == "none"
    assert coll_dims(g, lay, act).shape == (len(g.colls),)


@pytest.mark.parametrize("desc,dim", [
    ("TENSOR_MODEL_PARALLEL_GROUP", ("tp", True)), ("PIPELINE_MODEL_PARALLEL_GROUP", ("pp", True)),
    ("DATA_PARALLEL_GROUP", ("dp", True)), ("DATA_PARALLEL_GROUP_GLOO", ("dp", True)),
    ("DATA_PARALLEL_GROUP_WITH_CP", ("dp", False)), ("CONTEXT_PARALLEL_GROUP", ("cp", True)),
    ("EXPERT_MODEL_PARALLEL_GROUP", ("ep", True)), ("MODEL_PARALLEL_GROUP", ("tp-pp", False)),
    ("mesh_dp", ("dp", True)), ("mesh_dp_shard", ("dp_shard", True)), ("mesh_tp", ("tp", True)),
    ("mesh_pipe", ("pp", True)), ("mesh_cp", ("cp", True)), ("mesh_dp_shard_cp", ("dp_shard_cp", False)),
    ("default_pg", (None, False)), ("undefined", (None, False)),
])
def test_group_descriptions_name_their_dimension(desc, dim):
    assert _dim_of_desc(desc) == dim


def test_device_mesh_split_data_parallelism_multiplies(tmp_path):
    cfg = ([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]}]
           + _groups("mesh_dp_replicate", [0, 2], [1, 3], start=1) + _groups("mesh_dp_shard", [0, 1], [2, 3], start=3))
    _run, g, act, lay = _tiny(tmp_path, 4, cfg)
    assert (lay.dp, lay.tp, lay.pp) == (4, 1, 1) and lay.groups == {"dp": [[0, 1, 2, 3]]}
    assert lay.pg_dims == {"1": "dp", "2": "dp", "3": "dp", "4": "dp"}
    assert np.array_equal(coll_dims(g, lay, act), np.array([], str))
