"""[topology]: which ranks share a host, in place of what the run says; validated, applied before the
models that tell intra- from inter-node links, and said in the notes (also when it makes a scenario moot)."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

import tracekit
from replay.scenario import ScenarioError, scenario_from_dict
from replay.whatif import whatif
from tracekit.cli import cli

from .conftest import REPO

SAMPLES = REPO / "sample_traces"

OPTICAL = {"name": "ocs", "optical": {"circuit_bandwidth_gbps": 0.05, "reconfig_delay_ms": 1.0}}


@pytest.fixture(scope="module")
def no_hosts(tmp_path_factory):
    """The 2-host testbed run without its run.json: both traces carry the machine's one host name."""
    d = tmp_path_factory.mktemp("nohosts") / "ddp2"
    shutil.copytree(SAMPLES / "ddp2_2hosts_100mbit", d, ignore=shutil.ignore_patterns("run.json", ".tracekit"))
    return tracekit.open(str(d))


def test_topology_keys_are_checked():
    for doc, needle in (({"topology": {"ranks_per_host": 2, "hosts": [[0], [1]]}}, r"\[topology\] hosts: give ranks_per_host or hosts, not both"),
                        ({"topology": {"hosts": [[0, 1], [1]]}}, r"\[topology\] hosts: names rank 1 twice"),
                        ({"topology": {"hosts": [0, 1]}}, r"\[topology\] hosts: must be a non-empty list of non-empty lists"),
                        ({"topology": {"ranks_per_host": 0}}, r"\[topology\] ranks_per_host: must be an integer >= 1"),
                        ({"topology": {"hosts_per_rank": 1}}, r"\[topology\] hosts_per_rank: unknown key")):
        with pytest.raises(ScenarioError, match=needle):
            scenario_from_dict(doc, source="t.toml")


def test_an_optical_scenario_the_topology_makes_moot_says_so_and_topology_fixes_it(no_hosts):
    assert set(no_hosts.sql("SELECT DISTINCT hostname FROM ranks")["hostname"]) != {None}
    plain = whatif(no_hosts, [scenario_from_dict(OPTICAL, source="ocs.toml")])
    row = plain.iloc[1]
    assert row.reconfigurations == 0 and row.predicted_step_ns == row.measured_step_ns
    assert any("[optical] changes nothing" in n and "[topology]" in n for n in plain.attrs["notes"]["ocs"])
    hosts = whatif(no_hosts, [scenario_from_dict({**OPTICAL, "topology": {"ranks_per_host": 1}}, source="ocs.toml")])
    row = hosts.iloc[1]
    notes = hosts.attrs["notes"]["ocs"]
    # the circuits (0.05 GB/s = 400 Mbit/s) now carry the inter-host all-reduces the 100 Mbit/s links did
    assert row.predicted_step_ns < 0.6 * row.measured_step_ns
    assert any("topology from ocs.toml [topology] ranks_per_host = 1: 2 host(s)" in n for n in notes)
    assert not any("changes nothing" in n for n in notes)
    # the same hosts spelled out give the same prediction
    listed = whatif(no_hosts, [scenario_from_dict({**OPTICAL, "topology": {"hosts": [[0], [1]]}}, source="ocs.toml")])
    assert listed.iloc[1].predicted_step_ns == row.predicted_step_ns


def test_a_topology_that_leaves_a_rank_out_is_one_line_naming_the_key(no_hosts, tmp_path):
    f = tmp_path / "one.toml"
    f.write_text("[network]\nbandwidth_scale = 2.0\n[topology]\nhosts = [[0]]\n")
    r = CliRunner().invoke(cli, ["whatif", no_hosts.trace_dir, str(f)])
    assert r.exit_code == 2
    assert "[topology] hosts: rank 1 of the run is on no host" in r.output and "Traceback" not in r.output
