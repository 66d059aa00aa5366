"""Optical circuit switch model (replay/optical.py): the invariants of issue 7 as property tests
(equivalent topology with no delay = the inner model; a finer phase split never costs less; delay d
adds exactly count x d) and the circuit costs."""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.calibration import calibrate
from replay.costs import Link, colls_frame
from replay.network import AlphaBetaModel, MeasuredComm, WhatIfComm
from replay.optical import OpticalModel, Phase

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def frame(rows) -> pd.DataFrame:
    """rows: (op, pg_name, group_size, n_hosts, bytes, measured_transfer_ns) in arrival order."""
    cols = ["op", "pg_name", "group_size", "n_hosts", "bytes", "measured_transfer_ns"]
    return colls_frame(pd.DataFrame(rows, columns=cols), arrival_step_ns=10_000)


@functools.lru_cache(maxsize=1)
def base_model():
    rows = [(op, pg, p, h, int(s), int(2 * (p - 1) * 1e4 + 2 * (p - 1) / p * s / bw))
            for pg, p, h, bw in (("dp", 16, 2, 40.0), ("tp", 8, 1, 300.0), ("pp", 2, 2, 45.0))
            for op in ("all_reduce",) for s in 2 ** np.arange(12, 28, 3)]
    return calibrate(frame(rows))


coll_rows = st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(["dp", "tp", "pp", None]),
                               st.integers(0, 1 << 28), st.integers(1, 10 ** 9)), min_size=1, max_size=40)


def to_frame(rows):
    size = {"dp": (16, 2), "tp": (8, 1), "pp": (2, 2), None: (16, 2)}
    return frame([(op, pg, *size[pg], b, t) for op, pg, b, t in rows])


PHASES = [{"match": "all_reduce", "circuits": ["dp"]}, {"match": ["all_gather", "reduce_scatter"], "circuits": ["pp"]},
          {"match": "tp", "circuits": ["tp"]}]


@settings(max_examples=40, deadline=None)
@given(coll_rows, st.sampled_from(["job", "phase"]))
def test_equivalent_topology_without_delay_is_the_inner_model(rows, schedule):
    df = to_frame(rows)
    inner = WhatIfComm(base_model(), bandwidth_scale=2.0)
    opt = OpticalModel(inner, reconfig_delay_ms=0.0, schedule=schedule, phases=PHASES)
    assert opt.transfer_ns(df).tolist() == inner.transfer_ns(df).tolist()
    assert opt.reconfig_ns.sum() == 0
    meas = OpticalModel(MeasuredComm(), reconfig_delay_ms=0.0, schedule=schedule, phases=PHASES)
    assert meas.transfer_ns(df).tolist() == df["measured_transfer_ns"].tolist()


@settings(max_examples=40, deadline=None)
@given(coll_rows, st.floats(0.0, 500.0), st.sampled_from([None, 200.0]))
def test_delay_adds_exactly_count_times_delay(rows, delay_ms, bw):
    df = to_frame(rows)
    inner = WhatIfComm(base_model())
    zero = OpticalModel(inner, reconfig_delay_ms=0.0, schedule="phase", phases=PHASES, circuit_bandwidth_gbps=bw)
    t0 = zero.transfer_ns(df)
    opt = OpticalModel(inner, reconfig_delay_ms=delay_ms, schedule="phase", phases=PHASES, circuit_bandwidth_gbps=bw)
    t = opt.transfer_ns(df)
    assert opt.reconfigurations == zero.reconfigurations
    assert int(t.sum()) == int(t0.sum()) + opt.reconfigurations * opt.delay_ns
    assert (t - t0).tolist() == opt.reconfig_ns.tolist()
    assert int((opt.reconfig_ns > 0).sum()) == (opt.reconfigurations if opt.delay_ns else 0)


@settings(max_examples=40, deadline=None)
@given(coll_rows, st.floats(0.001, 100.0))
def test_finer_phase_split_never_costs_less(rows, delay_ms):
    df = to_frame(rows)
    inner = WhatIfComm(base_model())
    # the same circuits for every collective; the fine split names one assignment per op
    coarse = OpticalModel(inner, reconfig_delay_ms=delay_ms, schedule="phase",
                          phases=[{"match": "*", "circuits": ["*"]}])
    fine = OpticalModel(inner, reconfig_delay_ms=delay_ms, schedule="phase",
                        phases=[{"match": op, "circuits": ["*"], "name": op} for op in OPS])
    finer = OpticalModel(inner, reconfig_delay_ms=delay_ms, schedule="phase",
                         phases=[{"match": op, "circuits": ["*"], "name": f"{op}-{half}", "ordinals": rng}
                                 for op in OPS for half, rng in (("a", [0, 20]), ("b", [20, 10 ** 9]))])
    totals = [int(m.transfer_ns(df).sum()) for m in (coarse, fine, finer)]
    counts = [m.reconfigurations for m in (coarse, fine, finer)]
    assert counts[0] == 0
    assert counts[0] <= counts[1] <= counts[2]
    assert totals[0] <= totals[1] <= totals[2]


def test_phase_reconfiguration_points():
    df = to_frame([("all_reduce", "dp", 1 << 20, 10 ** 6), ("all_gather", "pp", 1 << 20, 10 ** 6),
                   ("all_gather", "tp", 1 << 20, 10 ** 6),   # intra-node: needs no circuit, no reconfiguration
                   ("all_reduce", "dp", 1 << 20, 10 ** 6), ("all_reduce", "dp", 1 << 20, 10 ** 6)])
    opt = OpticalModel(MeasuredComm(), reconfig_delay_ms=1.2, schedule="phase", phases=PHASES)
    got = opt.transfer_ns(df)
    assert opt.reconfigurations == 2
    assert opt.reconfig_ns.tolist() == [0, 1_200_000, 0, 1_200_000, 0]
    assert got.tolist() == [10 ** 6, 2_200_000, 10 ** 6, 2_200_000, 10 ** 6]
    assert opt.on_circuit.tolist() == [True, True, False, True, True]
    job = OpticalModel(MeasuredComm(), schedule="job", phases=PHASES)
    assert job.transfer_ns(df).tolist() == df["measured_transfer_ns"].tolist() and job.reconfigurations == 0


def test_direct_circuits_have_their_own_bandwidth_and_latency():
    i, e = Link(400.0, 2.0), Link(25.0, 10.0)
    inner = AlphaBetaModel(links={"intra_node": i, "inter_node": e})
    df = to_frame([("all_reduce", "dp", 1 << 26, 1), ("all_reduce", "pp", 1 << 26, 1), ("all_reduce", "tp", 1 << 26, 1)])
    opt = OpticalModel(inner, schedule="job", circuits=["dp"], circuit_bandwidth_gbps=100.0, circuit_latency_us=1.0)
    got = opt.transfer_ns(df)
    p, n = 16, float(1 << 26)
    assert got[0] == round(2 * (p - 1) * 1e3 + 2 * (p - 1) / p * n / 100.0)
    base = inner.transfer_ns(df)
    assert got[1] == base[1] and got[2] == base[2]  # pp not in the assignment; tp intra-node
    assert got[0] < base[0]


def test_circuits_under_a_calibrated_what_if_scale_by_the_ratio():
    m = base_model()
    fit = m.classes["pg:dp"]
    df = to_frame([("all_reduce", "dp", 1 << 26, 5_000_000)])
    got = OpticalModel(WhatIfComm(m), schedule="job", circuit_bandwidth_gbps=fit.bandwidth_gbps * 4,
                       circuit_latency_us=fit.alpha_ns / 1e3).transfer_ns(df)
    a, b = 30 * fit.alpha_ns, 30 / 16 * (1 << 26) * fit.beta_ns_per_byte
    assert got[0] == round(5e6 * (a + b / 4) / (a + b))


def test_measured_inner_cannot_take_other_circuits_and_bad_parameters():
    df = to_frame([("all_reduce", "dp", 1 << 20, 10)])
    with pytest.raises(ValueError, match="calibrate"):
        OpticalModel(MeasuredComm(), circuit_bandwidth_gbps=100.0).transfer_ns(df)
    for kw in (dict(reconfig_delay_ms=-1), dict(schedule="hourly"), dict(schedule="phase"),
               dict(phases=[{"circuits": ["*"]}]), dict(phases=[{"match": "*", "ordinals": [5, 1]}])):
        with pytest.raises(ValueError):
            OpticalModel(MeasuredComm(), **kw)
    assert Phase.from_dict({"match": "dp*"}).matches("all_reduce", "dp0", 3)
    assert not Phase.from_dict({"match": "dp*", "ordinals": [0, 3]}).matches("all_reduce", "dp0", 3)
