"""Scenario files (replay/scenario.py): the simplest file works as written, every section builds its
model, and a bad file fails with one line naming the file, the key and what is allowed."""
from __future__ import annotations

import builtins
import dataclasses
import re
import sys
import tomllib

import numpy as np
import pandas as pd
import pytest

from replay.compute import ComputeModel, Speedup
from replay.failures import Strategy
from replay.costs import LinkOverride
from replay.network import AlphaBetaModel, MeasuredComm, WhatIfComm
from replay.optical import OpticalModel, Phase
from replay.scenario import Scenario, ScenarioError, load_scenario, scenario_from_dict
from replay.specs import (SCHEMA, BatchSpec, ComputeSpec, FailuresSpec, HardwareSpec, HostOverride, MemorySpec,
                          NetworkSpec, OpticalSpec, ParallelismSpec, TopologySpec)
from tracekit.errors import TracekitError

from .conftest import REPO


def write(tmp_path, text, name="scen.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def colls():
    rows = []
    for pg, p, h, bw in (("0", 8, 2, 40.0), ("1", 8, 1, 300.0)):
        for s in 2 ** np.arange(12, 28, 3):
            rows.append(dict(op="all_reduce", bytes=int(s), group_size=p, n_hosts=h, pg_name=pg,
                             measured_transfer_ns=int(2 * (p - 1) * 1e4 + 2 * (p - 1) / p * s / bw)))
    df = pd.DataFrame(rows)
    df.insert(0, "coll_id", np.arange(len(df), dtype=np.int64))
    df["bytes"] = df["bytes"].astype("Int64")
    df["n_hosts"] = df["n_hosts"].astype("Int64")
    df["ranks"] = [list(range(p)) for p in df["group_size"]]
    df["timeline"] = "gpu"
    df["first_arrival_ns"] = 0
    df["order"] = np.arange(len(df), dtype=np.int64)
    return df


def test_simplest_file_works_as_written(tmp_path):
    sc = load_scenario(write(tmp_path, "[network]\nbandwidth_scale = 4.0\n", "faster.toml"))
    assert sc.name == "faster" and sc.seed == 0
    assert sc.optical is None and sc.failures is None and sc.parallelism == ParallelismSpec()
    df = colls()
    model = sc.comm_model(sc.calibrate(df))
    assert isinstance(model, WhatIfComm) and model.bandwidth_scale == 4.0
    got = model.transfer_ns(df)
    assert (got < df["measured_transfer_ns"].to_numpy()).all()
    assert isinstance(sc.compute_model(), ComputeModel)


def test_identity_changes_nothing():
    sc = Scenario.identity()
    df = colls()
    assert isinstance(sc.comm_model(), MeasuredComm)
    assert sc.comm_model().transfer_ns(df).tolist() == df["measured_transfer_ns"].tolist()
    nodes = pd.DataFrame({"node_id": [0, 1], "rank": [0, 0], "kind": ["cpu", "gpu"], "name": ["a", "b"],
                          "stream": pd.array([None, 7], dtype="Int64"), "gpu_kind": [None, "kernel"],
                          "kernel_class": [None, "compute"], "dur_ns": [123, 456]})
    assert sc.compute_model().node_durations(nodes).tolist() == [123, 456]


def test_empty_sections_are_the_default_specs():
    sc = scenario_from_dict({"network": {}, "compute": {}, "parallelism": {}}, "s.toml")
    assert (sc.network, sc.compute, sc.parallelism) == (NetworkSpec(), ComputeSpec(), ParallelismSpec())
    assert sc == Scenario(name="s", source="s.toml")
    assert not sc.needs_calibration and not sc.network.changes_network and not sc.parallelism.changes_layout
    # [optical] and [failures] say something by being there: a switch that never reconfigures, goodput figures
    both = scenario_from_dict({"optical": {}, "failures": {}}, "s.toml")
    assert both.optical == OpticalSpec() and both.failures == FailuresSpec()


FULL = """
name = "everything"
description = "all sections"
seed = 7
steps = 1000

[network]
bandwidth_scale = 2
latency_scale = 0.5
algorithm = "hierarchical"
calibrate = "run"
gpus_per_node = 8
[network.links.inter_node]
bandwidth_gbps = 100.0
[network.links.optical]
bandwidth_gbps = 200.0
latency_us = 1.0

[compute]
cpu_scale = 1.5
[[compute.speedup]]
kernel_class = "compute"
factor = 2.0
[[compute.speedup]]
name = "^flash"
factor = 3
[compute.rank_slowdown]
"3" = 1.25

[optical]
reconfig_delay_ms = 1.2
[[optical.phase]]
match = "all_reduce"
circuits = ["0"]
[[optical.phase]]
match = ["all_gather", "reduce_scatter"]
ordinals = [0, 100]

[failures]
n_gpus = 16384
strategy = "redundant"
redundancy_overhead = 0.05
checkpoint_interval_s = "optimal"
trials = 50

[parallelism]
dp = 128
tp = 8
pp = 16
micro_batches = 32
"""


def test_full_file_builds_every_model(tmp_path):
    sc = load_scenario(write(tmp_path, FULL))
    assert (sc.name, sc.description, sc.seed, sc.steps) == ("everything", "all sections", 7, 1000)
    df = colls()
    comm = sc.comm_model(sc.calibrate(df), with_optical=False)
    assert comm.algorithm == "hierarchical" and comm.links["inter_node"].bandwidth_gbps == 100.0
    assert "optical" not in comm.links
    cm = sc.compute_model()
    assert [s.factor for s in cm.speedups] == [2.0, 3.0] and cm.rank_slowdown == {3: 1.25} and cm.cpu_scale == 1.5
    assert sc.optical.schedule == "phase"  # phases given: per-phase schedule by default
    assert sc.optical.circuit_bandwidth_gbps == 200.0 and sc.optical.circuit_latency_us == 1.0  # from links.optical
    opt = sc.optical.model(comm)
    assert isinstance(opt, OpticalModel) and len(opt.phases) == 2
    assert len(opt.transfer_ns(df)) == len(df)
    # what the engine calls: the collectives in, the whole comm model (network inside the OCS) out
    whole = sc.comm_model(df)
    assert isinstance(whole, OpticalModel) and isinstance(whole.inner, WhatIfComm)
    assert whole.transfer_ns(df).tolist() == opt.transfer_ns(df).tolist()
    assert isinstance(sc.failures.strategy, Strategy) and sc.failures.strategy.redundancy_overhead == 0.05
    r = sc.failures.goodput(step_ns=4e9)
    assert r.strategy == "redundant" and r.seed == 7 and r.mc_trials == 50
    assert sc.parallelism == ParallelismSpec(dp=128, tp=8, pp=16, micro_batches=32)


def test_yaml_same_as_toml(tmp_path):
    pytest.importorskip("yaml")
    y = load_scenario(write(tmp_path, "network:\n  bandwidth_scale: 4.0\ncompute:\n  rank_slowdown: {3: 2.0}\n", "s.yaml"))
    assert y.network == NetworkSpec(bandwidth_scale=4.0) and y.compute.rank_slowdown == {3: 2.0}
    t = load_scenario(write(tmp_path, "[network]\nbandwidth_scale = 4.0\n[compute.rank_slowdown]\n3 = 2.0\n", "s.toml"))
    assert (y.network, y.compute) == (t.network, t.compute)


def test_yaml_without_pyyaml_says_what_to_do(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_yaml(name, *a, **kw):
        if name == "yaml":
            raise ImportError("no yaml")
        return real_import(name, *a, **kw)

    monkeypatch.delitem(sys.modules, "yaml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_yaml)
    with pytest.raises(ScenarioError, match="pip install pyyaml, or write the scenario in TOML"):
        load_scenario(write(tmp_path, "network: {}\n", "s.yml"))


@pytest.mark.parametrize("text,where,what", [
    ("[network]\nbandwith_scale = 4.0\n", "[network] bandwith_scale",
     "unknown key; allowed: bandwidth_scale, latency_scale, algorithm"),
    ("[network]\nbandwidth_scale = 0\n", "[network] bandwidth_scale", "must be a number > 0"),
    ("[network]\nbandwidth_scale = \"fast\"\n", "[network] bandwidth_scale", "must be a number > 0"),
    ("[network]\nbandwidth_scale = nan\n", "[network] bandwidth_scale", "must be a number > 0"),
    ("[network]\nbandwidth_scale = true\n", "[network] bandwidth_scale", "must be a number > 0"),
    ("[network]\nalgorithm = \"butterfly\"\n", "[network] algorithm", "must be one of: ring, tree, hierarchical"),
    ("[network.links.backbone]\nbandwidth_gbps = 1\n", "[network.links] backbone", "allowed: intra_node, inter_node, optical"),
    ("[network.links.inter_node]\nlatency_us = -1\n", "[network.links.inter_node] latency_us", "must be a number >= 0"),
    ("[network]\nalgorithm = \"measured\"\nbandwidth_scale = 2.0\n", "[network] algorithm", "cannot be combined"),
    ("[network]\ncalibrate = \"nccl_tests\"\n", "[network] nccl_tests_group_size", "required"),
    ("[netwrok]\nbandwidth_scale = 4.0\n", "netwrok", "unknown key; allowed: name, description, seed, steps, network"),
    ("seed = -1\n", "seed", "must be an integer >= 0"),
    ("[compute]\ncpu_scale = -2\n", "[compute] cpu_scale", "must be a number > 0"),
    ("[[compute.speedup]]\nname = \"(unclosed\"\nfactor = 2\n", "[[compute.speedup]] #1 name", "not a valid regular expression"),
    ("[[compute.speedup]]\nkernel_class = \"compute\"\nfactor = 2\n[[compute.speedup]]\nkernel_class = \"gpu\"\nfactor = 2\n",
     "[[compute.speedup]] #2 kernel_class", "must be one of: compute, communication, memory, other"),
    ("[[compute.speedup]]\nfactor = 2\n", "[[compute.speedup]] #1 kernel_class", "needs kernel_class or name"),
    ("[[compute.speedup]]\nkernel_class = \"compute\"\n", "[[compute.speedup]] #1 factor", "missing"),
    ("[compute.rank_slowdown]\nzero = 2.0\n", "[compute.rank_slowdown] zero", "rank must be an integer >= 0"),
    ("[compute.rank_slowdown]\n\"2\" = 0\n", "[compute.rank_slowdown] 2", "must be a number > 0"),
    ("[optical]\nschedule = \"phase\"\n", "[optical] schedule", "needs at least one"),
    ("[optical]\nreconfig_delay_ms = -1\n", "[optical] reconfig_delay_ms", "must be a number >= 0"),
    ("[[optical.phase]]\ncircuits = [\"*\"]\n", "[[optical.phase]] #1 match", "missing"),
    ("[[optical.phase]]\nmatch = \"*\"\nordinals = [5, 2]\n", "[[optical.phase]] #1 ordinals", "start <= stop"),
    ("[failures]\nstrategy = \"pray\"\n", "[failures] strategy", "must be one of: checkpoint_restart, in_memory"),
    ("[failures]\ncheckpoint_interval_s = \"often\"\n", "[failures] checkpoint_interval_s", '"optimal"'),
    ("[failures]\nstrategy = \"in_memory\"\nreplicas = 4\n", "[failures] replicas", "does not apply to strategy in_memory"),
    ("[failures]\nrollback_fraction = 2\nstrategy = \"live_migration\"\n", "[failures] rollback_fraction", "in [0, 1]"),
    ("[parallelism]\ndp = 0\n", "[parallelism] dp", "must be an integer >= 1"),
    ("[parallelism]\ntp = 2.5\n", "[parallelism] tp", "must be an integer >= 1"),
    # 10^8 ranks would hold ~15 GB per gradient collective, and grew until the machine's memory was gone
    ("[parallelism]\ndp = 100000000\n", "[parallelism] dp", "must be at most 1,048,576 (2^20): the replay holds"),
    ("[memroy]\nx = 1\n", "memroy", "unknown key; allowed: name, description, seed, steps, network, compute, "
                                      "optical, failures, parallelism, topology, hardware, memory, batch"),
    ("[memory]\nx = 1\n", "[memory] x", "unknown key; allowed: activation_checkpointing, offload_optimizer, host_link_gbps, reserve_pct"),
    ("[memory]\nactivation_checkpointing = \"some\"\n", "[memory] activation_checkpointing", "none"),
    ("[batch]\nscale = 0\n", "[batch] scale", "must be a number > 0"),
    ("[batch]\nscale = -2\n", "[batch] scale", "must be a number > 0"),
    ("network = 4\n", "network", "must be a table"),
])
def test_invalid_files_name_file_key_and_allowed(tmp_path, text, where, what):
    p = write(tmp_path, text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}: {where}: "), msg
    assert what in msg, msg
    assert isinstance(e.value, TracekitError)


def test_unreadable_and_unknown_format(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.toml")
    with pytest.raises(ScenarioError, match=r"allowed: \.toml, \.yaml, \.yml"):
        load_scenario(write(tmp_path, "x", "s.json"))
    with pytest.raises(ScenarioError, match="not valid TOML") as e:
        load_scenario(write(tmp_path, "[network\nbandwidth_scale = 4\n"))
    assert "\n" not in str(e.value)


def test_calibrate_none_uses_scaled_default_links(tmp_path):
    sc = load_scenario(write(tmp_path, "[network]\ncalibrate = \"none\"\nbandwidth_scale = 2.0\nalgorithm = \"ring\"\n"
                                       "[network.links.intra_node]\nbandwidth_gbps = 100.0\n"))
    assert sc.calibrate(colls()) is None
    m = sc.comm_model()
    assert isinstance(m, AlphaBetaModel)
    assert m.links["inter_node"].bandwidth_gbps == 100.0  # default 50 GB/s x 2
    assert m.links["intra_node"].bandwidth_gbps == 100.0  # given: as written, not scaled


def test_comm_model_from_the_collectives_frame(tmp_path):
    df = colls()
    assert isinstance(Scenario.identity().comm_model(df), MeasuredComm)
    sc = load_scenario(write(tmp_path, "[network]\nbandwidth_scale = 4.0\n"))
    assert sc.comm_model(df).transfer_ns(df).tolist() == sc.comm_model(sc.calibrate(df)).transfer_ns(df).tolist()
    only_ocs = load_scenario(write(tmp_path, "[optical]\nreconfig_delay_ms = 3\n[[optical.phase]]\nmatch = \"0\"\n"
                                             "[[optical.phase]]\nmatch = \"all_gather\"\n", "ocs.toml"))
    m = only_ocs.comm_model(df)
    assert isinstance(m, OpticalModel) and isinstance(m.inner, MeasuredComm)
    assert m.transfer_ns(df).tolist() == df["measured_transfer_ns"].tolist()  # one phase used: no reconfiguration
    circuits = load_scenario(write(tmp_path, "[optical]\ncircuit_bandwidth_gbps = 400.0\n", "c.toml"))
    faster = circuits.comm_model(df).transfer_ns(df)
    inter = (df["n_hosts"] > 1).to_numpy()
    assert (faster[inter] < df["measured_transfer_ns"].to_numpy()[inter]).all()
    assert faster[~inter].tolist() == df["measured_transfer_ns"][~inter].tolist()
    with pytest.raises(ScenarioError, match="calibrated"):
        circuits.comm_model(None)


def test_changed_network_without_base_is_an_error(tmp_path):
    sc = load_scenario(write(tmp_path, "[network]\nbandwidth_scale = 2.0\n"))
    with pytest.raises(ScenarioError, match="calibrate"):
        sc.comm_model(None)


def test_nccl_tests_calibration_from_scenario(tmp_path):
    sc = load_scenario(write(tmp_path, "[network]\ncalibrate = \"nccl_tests\"\nnccl_tests_group_size = 16\n"
                                       "nccl_tests_hosts = 2\nbandwidth_scale = 2\n"))
    sizes = 2 ** np.arange(12, 28)
    t_us = (2 * 15 * 10e3 + 2 * 15 / 16 * sizes / 45.0) / 1e3
    nt = pd.DataFrame({"op": "all_reduce", "size_bytes": sizes, "time_us": t_us, "in_place": False})
    base = sc.calibrate(colls(), nccl_tests=nt)
    assert base.links["inter_node"].bandwidth_gbps == pytest.approx(45.0, rel=1e-3)
    with pytest.raises(ScenarioError, match="no nccl-tests rows"):
        sc.calibrate(colls(), nccl_tests=nt.iloc[:0])


# ---- docs/whatif_models.md's key table is the specs' (keys and defaults)

def _schema_rows(schema, table=(), array=False):
    """(section as the docs write it, key) for every key of the schema."""
    label = "top" if not table else (f"[[{'.'.join(table)}]]" if array else f"[{'.'.join(table)}]")
    for k, rule in schema.items():
        if isinstance(rule, dict):
            if all(isinstance(v, dict) for v in rule.values()):  # one sub-table per link class
                yield from _schema_rows(next(iter(rule.values())), table + (k, "<class>"))
            else:
                yield from _schema_rows(rule, table + (k,))
        elif isinstance(rule, tuple) and rule[0] == "array":
            yield from _schema_rows(rule[1], table + (k,), array=True)
        elif isinstance(rule, tuple) and rule[0] == "map":
            yield f"[{'.'.join(table + (k,))}]", '"<rank>"'
        else:
            yield label, k


def _doc_rows():
    text = (REPO / "docs" / "whatif_models.md").read_text()
    body = text[text.index("## 5. Scenario files"):]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`") and cells[0] != "section":
            rows[(cells[0].strip("`"), cells[1].strip("`"))] = cells[3]
    return rows


def _literal(cell):
    """The default a cell states as a TOML value in backticks, or None when it says it in words."""
    m = re.match(r"`([^`]*)`", cell)
    if not m:
        return None
    try:
        return tomllib.loads(f"v = {m.group(1)}")["v"]
    except tomllib.TOMLDecodeError:
        return None


SECTION_SPECS = {"top": Scenario, "[network]": NetworkSpec, "[network.links.<class>]": LinkOverride,
                 "[compute]": ComputeSpec, "[[compute.speedup]]": Speedup, "[optical]": OpticalSpec,
                 "[[optical.phase]]": Phase, "[failures]": FailuresSpec, "[parallelism]": ParallelismSpec,
                 "[[network.hosts]]": HostOverride, "[topology]": TopologySpec,
                 "[hardware]": HardwareSpec, "[memory]": MemorySpec, "[batch]": BatchSpec}


def _spec_default(section, key):
    cls = SECTION_SPECS.get(section)
    for f in dataclasses.fields(cls) if cls else ():
        if (f.metadata.get("key") or f.name) == key:
            if f.default is not dataclasses.MISSING:
                v = f.default
            elif f.default_factory is not dataclasses.MISSING:
                v = f.default_factory()
            else:
                return "required"
            return v.kind if isinstance(v, Strategy) else (list(v) if isinstance(v, tuple) else v)
    return "not a field"  # e.g. a strategy's parameter: the strategy's own default


def test_documented_keys_and_defaults_are_the_specs():
    doc = _doc_rows()
    keys = set(_schema_rows(SCHEMA))
    assert set(doc) == keys, (set(doc) - keys, keys - set(doc))
    for (section, key), cell in doc.items():
        stated, spec = _literal(cell), _spec_default(section, key)
        if stated is not None:
            assert stated == spec, (section, key, cell, spec)
        elif (section, key) != ("top", "name"):  # a file's name defaults to its stem, Scenario()'s to "identity"
            assert spec in (None, "required", "not a field"), (section, key, cell, spec)
