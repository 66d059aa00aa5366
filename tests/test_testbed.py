"""The namespace testbed: real namespaces, veth links and tc shaping (needs root and iproute2)."""
from __future__ import annotations

import os
import subprocess

import pytest

from tracekit import testbed
from tracekit.testbed import Testbed, TestbedError, list_namespaces

_why = testbed.unavailable_reason()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


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
    finally:
        tb.teardown()
    tb.teardown()
    assert list_namespaces(tb.prefix) == []


def test_failed_create_cleans_up(monkeypatch):
    tb = Testbed(2, 100, prefix=_prefix("fail"))

    def broken(netns, dev, rate_mbit):
        raise TestbedError("tc refused")

    monkeypatch.setattr(testbed, "_set_rate", broken)
    with pytest.raises(TestbedError, match="tc refused"):
        tb.create()
    assert list_namespaces(tb.prefix) == []


def test_bad_configuration_is_rejected():
    with pytest.raises(TestbedError, match="at least 2 hosts"):
        Testbed(1)
    with pytest.raises(TestbedError, match="hosts 0..1"):
        Testbed(2, 100, host_rates_mbit={5: 10})


def test_shaped_allreduce_runs_at_the_configured_rate():
    pytest.importorskip("torch", reason="the all-reduce probe needs torch (pip install 'tracekit[capture]')")
    from tracekit.capture.allreduce_probe import ring_allreduce_model_s, run_on_testbed

    nbytes, rate_mbit = 4 << 20, 200
    with Testbed(2, rate_mbit, prefix=_prefix("rate")) as tb:
        times_ns = sorted(run_on_testbed(tb, nbytes, iters=3))
    assert list_namespaces(tb.prefix) == []
    median_s = times_ns[1] / 1e9
    model_s = ring_allreduce_model_s(nbytes, 2, rate_mbit)
    assert abs(median_s - model_s) / model_s <= 0.25, (median_s, model_s)
