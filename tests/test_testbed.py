"""The namespace testbed: real namespaces, veth links and tc shaping (needs root and iproute2)."""
from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from tracekit import testbed
from tracekit.testbed import Testbed, TestbedError, list_namespaces

_why = testbed.unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why is not None, reason=_why or "")]  # slow: network namespaces joined by shaped links


def _prefix(tag: str) -> str:
    return f"tk-{os.getpid()}-{tag}-"


def test_create_is_idempotent_and_teardown_leaves_nothing():
    tb = Testbed(3, 100, host_rates_mbit={2: 25}, prefix=_prefix("idem"))
    try:
        tb.create()
        tb.create()  # again: rebuilt, not doubled
        assert sorted(list_namespaces(tb.prefix)) == sorted([h.netns for h in tb.hosts] + [tb.switch_netns])
        addrs = subprocess.run(["ip", "-n", tb.hosts[2].netns, "-4", "addr", "show", "tk0"],
                               capture_output=True, text=True, check=True).stdout
        assert "10.233.0.3/24" in addrs
        qdisc = subprocess.run(["tc", "-n", tb.switch_netns, "qdisc", "show", "dev", "p2"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "25Mbit" in qdisc
        # jumbo frames one at a time, so the bucket holds two frames (not a 64 KiB GSO batch)
        burst = int(re.search(r"burst (\d+)b", qdisc).group(1))
        assert abs(burst - 2 * testbed.FRAME_BYTES) <= 64  # tc prints the bucket rounded to its time base
        for ns, dev in ((tb.hosts[0].netns, "tk0"), (tb.switch_netns, "p2"), (tb.switch_netns, "br0")):
            link = subprocess.run(["ip", "-d", "-n", ns, "link", "show", dev], capture_output=True, text=True,
                                  check=True).stdout
            assert "mtu 9000" in link, (dev, link)
            if dev != "br0":
                assert "gso_max_segs 1 " in link, (dev, link)
    finally:
        tb.teardown()
    tb.teardown()
    assert list_namespaces(tb.prefix) == []


def test_failed_create_cleans_up(monkeypatch):
    tb = Testbed(2, 100, prefix=_prefix("fail"))

    def broken(self, netns, dev, rate_mbit):
        raise TestbedError("tc refused")

    monkeypatch.setattr(Testbed, "_set_rate", broken)
    with pytest.raises(TestbedError, match="tc refused"):
        tb.create()
    assert list_namespaces(tb.prefix) == []


def test_other_link_kinds_gso_batches_of_1500_byte_frames_and_a_deep_bucket():
    # a stock NIC's link: 1500-byte frames in GSO/TSO batches, behind a 256 KB burst (cloud burst credits)
    tb = Testbed(2, 100, prefix=_prefix("gso"), frames="gso", burst_bytes=256_000)
    try:
        tb.create()
        link = subprocess.run(["ip", "-d", "-n", tb.hosts[0].netns, "link", "show", "tk0"], capture_output=True,
                              text=True, check=True).stdout
        assert "mtu 1500" in link and "gso_max_segs 1 " not in link and "gso_max_size 65536" in link
        qdisc = subprocess.run(["tc", "-n", tb.hosts[1].netns, "qdisc", "show", "dev", "tk0"],
                               capture_output=True, text=True, check=True).stdout
        m = re.search(r"burst (\d+)(b|Kb|Mb)", qdisc)  # tc prints the bucket in bytes, KiB or MiB
        assert abs(int(m.group(1)) * {"b": 1, "Kb": 1 << 10, "Mb": 1 << 20}[m.group(2)] - 256_000) <= 1 << 10
        meta = tb.describe()
        assert meta["frames"] == "gso" and meta["mtu"] == 1500 and meta["links"][0]["burst_bytes"] == 256_000
        # the round trip a small datagram takes over the link, which bounds a fitted latency: tens of us on a veth
        # pair (17-22 us measured here), never the 1 ms the queue may hold
        assert 1.0 < meta["rtt_us"] < 1000.0
    finally:
        tb.teardown()
    assert list_namespaces(tb.prefix) == []


def test_bad_configuration_is_rejected():
    with pytest.raises(TestbedError, match="link frames 'tiny': allowed jumbo, gso"):
        Testbed(2, 100, frames="tiny")
    with pytest.raises(TestbedError, match="drops every gso packet: give at least 68564 bytes"):
        Testbed(2, 100, frames="gso", burst_bytes=20_000)
    with pytest.raises(TestbedError, match="at least 2 hosts"):
        Testbed(1)
    with pytest.raises(TestbedError, match="hosts 0..1"):
        Testbed(2, 100, host_rates_mbit={5: 10})


def _tbf_counters(netns: str, dev: str) -> dict:
    """The token bucket's own counters on one link end (`tc -s qdisc`): bytes sent, and how often it held
    a packet back for want of tokens."""
    out = subprocess.run(["tc", "-s", "-n", netns, "qdisc", "show", "dev", dev], capture_output=True, text=True,
                         check=True).stdout
    assert " tbf " in out, out
    sent = re.search(r"Sent (\d+) bytes", out)
    over = re.search(r"overlimits (\d+)", out)
    return {"sent_bytes": int(sent.group(1)), "overlimits": int(over.group(1))}


def test_shaped_allreduce_is_held_to_the_configured_rate():
    """The link never runs faster than its rate: the all-reduce takes at least the ring's bytes over the rate
    (less one bucket), and the bucket itself counts the packets it held back. Both hold on a loaded machine,
    where a slower CPU can only lengthen the time (tests assert no upper bound on wall-clock time; how close
    TCP comes to the rate is measured in docs/capture.md: 99.1-99.8%)."""
    pytest.importorskip("torch", reason="the all-reduce probe needs torch (pip install 'tracekit[capture]')")
    from tracekit.capture.allreduce_probe import ring_allreduce_model_s, run_on_testbed

    nbytes, rate_mbit, iters, warmup = 4 << 20, 200, 3, 1
    with Testbed(2, rate_mbit, prefix=_prefix("rate")) as tb:
        times_ns = run_on_testbed(tb, nbytes, iters=iters, warmup=warmup)
        counters = [_tbf_counters(h.netns, h.ifname) for h in tb.hosts]
        burst = testbed.burst_bytes(tb.frames, rate_mbit, tb.burst_bytes)
    assert list_namespaces(tb.prefix) == []
    # each end sends 2(p-1)/p of the buffer per all-reduce (p = 2: the whole buffer), headers on top
    for c in counters:
        assert c["sent_bytes"] >= nbytes * (iters + warmup), c
        assert c["overlimits"] > 0, c
    floor_s = ring_allreduce_model_s(nbytes, 2, rate_mbit) - burst * 8 / (rate_mbit * 1e6)
    assert min(times_ns) / 1e9 >= floor_s, (times_ns, floor_s)


@pytest.mark.slow
def test_demo_job_on_a_bridged_testbed_with_a_slow_link(tmp_path):
    pytest.importorskip("torch", reason="the demo trainer needs torch (pip install 'tracekit[capture]')")
    import tracekit
    from tracekit.capture.demo import DemoConfig, run

    doc = run(DemoConfig(out_dir=str(tmp_path / "tb"), ranks=3, hosts=3, link_rate_mbit=400, slow_link_host=2,
                         slow_link_rate_mbit=50, steps=1, warmup=1, timed_steps=1, d_model=32, layers=1,
                         vocab=128, seq_len=16, batch_size=4))
    assert doc["hostnames"] == ["testbed-h0", "testbed-h1", "testbed-h2"]
    assert [link["rate_mbit"] for link in doc["testbed"]["links"]] == [400, 400, 50]
    assert doc["testbed"]["topology"] == "bridge"
    assert all(r["net_ifname"] == "tk0" for r in doc["ranks"])
    # the traces themselves say which host each rank ran on (Kineto's host_name)
    hosts = tracekit.open(str(tmp_path / "tb")).sql("SELECT hostname FROM ranks ORDER BY rank")["hostname"]
    assert hosts.tolist() == ["testbed-h0", "testbed-h1", "testbed-h2"]
    assert [ns for ns in list_namespaces("tk-") if ns.startswith(f"tk-{os.getpid()}-")] == []


def test_run_all_stops_the_others_when_one_command_fails():
    import time

    with Testbed(2, None, prefix=_prefix("runall")) as tb:
        t0 = time.monotonic()
        results = tb.run_all([(0, ["sh", "-c", "echo oops >&2; exit 3"]), (1, ["sleep", "30"])], timeout_s=60)
        took_s = time.monotonic() - t0
        ok = tb.run_all([(h.index, ["sh", "-c", "echo $TRACEKIT_HOST_LABEL $GLOO_SOCKET_IFNAME $(hostname)"])
                         for h in tb.hosts])
    assert results[0] == (3, "", "oops\n")
    assert results[1][0] != 0 and took_s < 20
    # each host has its own hostname (a UTS namespace), the machine's is untouched
    assert [out for _code, out, _err in ok] == ["testbed-h0 tk0 testbed-h0\n", "testbed-h1 tk0 testbed-h1\n"]
    assert socket.gethostname() not in ("testbed-h0", "testbed-h1")
