"""Every real trace under ../shared/traces ingests; counts match the JSON; info is right."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

import tracekit

from .conftest import SHARED_TRACES, shared_trace_dir
from .roundtrip import load_source_events, normalise_source, store_events

pytestmark = pytest.mark.slow  # ingests and round-trips the large shared traces

# trace dirs (relative to ../shared/traces) -> how ranks are found
TRACE_DIRS = {
    "astra-sim/megatron_tp8": "auto",
    "hta/amd_trace": "order",
    "hta/cpu_only": "auto",
    "hta/critical_path/alexnet": "order",
    "hta/critical_path/cuda_event_sync": "order",
    "hta/critical_path/cuda_event_sync_multi_stream": "order",
    "hta/critical_path/simple_add": "order",
    "hta/cupti_profiler": "order",
    "hta/df_index_resolver": "auto",
    "hta/distributed_info_unavailable": "order",
    "hta/nccl_parser_config": "auto",
    "hta/ns_resolution_trace": "auto",
    "hta/rank_non_gpu": "auto",
    "hta/rank_unavailable": "order",
    "hta/trace_filter": "auto",
    "hta/triton_example": "order",
    "tracelens/b200_eager": "auto",
    "tracelens/h100_qwen_inference": "order",
}


def test_every_shared_trace_dir_is_listed():
    shared_trace_dir()
    dirs = {str(p.parent.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.rglob("*.json.gz") if "chakra_et" not in p.parts}
    assert dirs == set(TRACE_DIRS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    shared_trace_dir()
    base = tmp_path_factory.mktemp("stores")
    out = {}
    for rel, rank_from in TRACE_DIRS.items():
        out[rel] = tracekit.open(str(SHARED_TRACES / rel), store=str(base / rel.replace("/", "_")), rank_from=rank_from)
    return out


def _json_counts(path: Path) -> collections.Counter:
    c = collections.Counter()
    for e in load_source_events(path):
        c[(e.get("ph"), e.get("cat") or "")] += 1
    return c


@pytest.mark.parametrize("rel", sorted(TRACE_DIRS))
def test_event_counts_match_the_json(runs, rel):
    run = runs[rel]
    stored = run.sql("SELECT source_file, ph, coalesce(cat, '') AS cat, count(*) AS n FROM events "
                     "JOIN ranks USING (rank) GROUP BY ALL")
    for source in sorted(set(stored["source_file"])):
        expect = _json_counts(SHARED_TRACES / rel / source)
        got = {(r.ph, r.cat): r.n for r in stored[stored["source_file"] == source].itertuples()}
        assert got == dict(expect), source


def test_trace_filter_info(runs):
    info = runs["hta/trace_filter"].info()
    assert info["ranks"] == [0, 1] and info["world_size"] == 128
    assert any("2 of 128 ranks" in n for n in info["notes"])


def test_megatron_is_a_complete_eight_rank_job(runs):
    run = runs["astra-sim/megatron_tp8"]
    info = run.info()
    assert info["ranks"] == list(range(8)) and info["world_size"] == 8
    assert set(info["skipped"]) == {f"chakra_et/megatron_et_{i}.json.gz" for i in range(8)}
    k = run.sql("SELECT rank, count(*) AS n, count(*) FILTER (WHERE name LIKE 'ncclDevKernel_AllReduce%') AS ar "
                "FROM kernels GROUP BY rank ORDER BY rank")
    assert k["ar"].tolist() == [84] * 8
    assert k["n"].tolist() == [690] * 8
    assert run.sql("SELECT DISTINCT time_style FROM ranks")["time_style"].tolist() == ["absolute"]


def test_nccl_collective_args_are_typed(runs):
    run = runs["hta/nccl_parser_config"]
    c = run.sql("SELECT coll_name, group_size, in_msg_nelems, pg_ranks FROM events "
                "WHERE coll_name IS NOT NULL LIMIT 5")
    assert len(c) > 0 and c["group_size"].notna().all() and c["in_msg_nelems"].notna().all()


@pytest.mark.parametrize("rel", ["hta/ns_resolution_trace", "tracelens/b200_eager", "hta/trace_filter"])
def test_round_trip_real_trace(runs, rel):
    run = runs[rel]
    ranks = run.sql("SELECT rank, source_file, coalesce(base_time_ns, 0) AS base FROM ranks ORDER BY rank")
    r = ranks.iloc[0]
    base = int(r.base)
    src = [normalise_source(e, base) for e in load_source_events(SHARED_TRACES / rel / r.source_file)]
    got = store_events(run, int(r["rank"]))
    assert len(got) == len(src)
    # names are stored as text: compare them as text
    for a, b in zip(got, src):
        if "name" in b:
            b["name"] = b["name"] if isinstance(b["name"], str) else str(b["name"])
    mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(got, src)) if a != b]
    assert not mismatches[:3]
