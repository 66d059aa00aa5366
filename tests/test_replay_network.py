"""Communication models (replay/network.py, costs.py, calibration.py): alpha-beta costs against the closed
forms, calibration recovering known alpha/beta from noisy synthetic runs, and the what-if invariants (identity
is exact, bandwidth scaling touches only the beta part, rows without bytes)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.calibration import calibrate, calibrate_nccl_tests
from replay.costs import DEFAULT_LINKS, Link, LinkOverride, colls_frame
from replay.network import AlphaBetaModel, MeasuredComm, WhatIfComm, class_keys

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def frame(rows: list[dict]) -> pd.DataFrame:
    """A collectives frame with the engine's columns and dtypes."""
    return colls_frame(rows, arrival_step_ns=1000)


def ring_ns(op, p, n, alpha_ns, beta):
    if op == "all_reduce":
        return 2 * (p - 1) * alpha_ns + 2 * (p - 1) / p * n * beta
    return (p - 1) * alpha_ns + (p - 1) / p * n * beta


# pg name -> (alpha ns, beta ns/byte, group size, hosts)
TRUTH = {"0": (20e3, 1 / 40, 8, 2), "1": (5e3, 1 / 300, 8, 1), "2": (12e3, 1 / 80, 4, 2)}


def synthetic(noise=0.01, seed=1, truth=TRUTH, sizes=2 ** np.arange(10, 28, 2), reps=3):
    rng = np.random.default_rng(seed)
    rows = []
    for pg, (al, be, p, h) in truth.items():
        for op in OPS:
            for n in sizes:
                for _ in range(reps):
                    t = ring_ns(op, p, float(n), al, be) * (1 + noise * rng.standard_normal())
                    rows.append(dict(op=op, bytes=int(n), group_size=p, n_hosts=h, pg_name=pg,
                                     measured_transfer_ns=int(round(t))))
    return frame(rows)


def test_ring_tree_costs_match_the_closed_forms():
    links = {"intra_node": Link(bandwidth_gbps=10.0, latency_us=10.0)}
    df = frame([dict(op=op, bytes=1_000_000, group_size=4, n_hosts=1, pg_name=None, measured_transfer_ns=1)
                for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "barrier")])
    got = AlphaBetaModel(links=links, algorithm="ring").transfer_ns(df)
    a, nb = 10_000.0, 1_000_000 / 10.0  # alpha ns, n * beta ns
    want = [6 * a + 1.5 * nb, 3 * a + 0.75 * nb, 3 * a + 0.75 * nb, 3 * a + 0.75 * nb, 3 * a + nb, a + nb, 4 * a]
    assert got.tolist() == [round(w) for w in want]
    tree = AlphaBetaModel(links=links, algorithm="tree").transfer_ns(df)
    assert tree[0] == round(2 * 2 * a + 2 * nb)  # 2 log2(4) a + 2 n b
    assert tree[4] == round(2 * a + nb)          # broadcast: log2(p) a + n b
    assert tree[1] == got[1]                      # no tree all_gather: ring


def test_link_class_from_hosts_and_single_rank_costs_nothing():
    df = frame([dict(op="all_reduce", bytes=1 << 20, group_size=8, n_hosts=h, pg_name=None, measured_transfer_ns=7)
                for h in (1, 2)] + [dict(op="all_reduce", bytes=1 << 20, group_size=1, n_hosts=1, pg_name=None,
                                         measured_transfer_ns=7)])
    got = AlphaBetaModel().transfer_ns(df)
    i, e = DEFAULT_LINKS["intra_node"], DEFAULT_LINKS["inter_node"]
    assert got[0] == round(ring_ns("all_reduce", 8, 1 << 20, i.alpha_ns, i.beta_ns_per_byte))
    assert got[1] == round(ring_ns("all_reduce", 8, 1 << 20, e.alpha_ns, e.beta_ns_per_byte))
    assert got[2] == 0


def test_hierarchical_is_two_levels_and_ring_on_one_node():
    i, e = Link(400.0, 2.0), Link(50.0, 10.0)
    df = frame([dict(op="all_reduce", bytes=1 << 24, group_size=16, n_hosts=2, pg_name=None, measured_transfer_ns=1),
                dict(op="all_reduce", bytes=1 << 24, group_size=8, n_hosts=1, pg_name=None, measured_transfer_ns=1)])
    m = AlphaBetaModel(links={"intra_node": i, "inter_node": e}, algorithm="hierarchical")
    got = m.transfer_ns(df)
    n, g, N = float(1 << 24), 8, 2
    want = (2 * (g - 1) * i.alpha_ns + 2 * (g - 1) / g * n * i.beta_ns_per_byte
            + 2 * (N - 1) * e.alpha_ns + 2 * (N - 1) / N * (n / g) * e.beta_ns_per_byte)
    assert got[0] == round(want)
    assert got[1] == AlphaBetaModel(links={"intra_node": i}, algorithm="ring").transfer_ns(df)[1]
    ring = AlphaBetaModel(links={"intra_node": i, "inter_node": e}, algorithm="ring").transfer_ns(df)
    assert got[0] < ring[0]  # the point of two levels: only n/g crosses the NICs


def test_auto_never_costs_more_than_any_fixed_algorithm():
    rows = [dict(op=op, bytes=int(n), group_size=16, n_hosts=2, pg_name=None, measured_transfer_ns=1)
            for op in ("all_reduce", "broadcast") for n in (1 << 10, 1 << 16, 1 << 26)]
    df = frame(rows)
    auto = AlphaBetaModel(algorithm="auto").transfer_ns(df)
    for alg in ("ring", "tree", "hierarchical"):
        assert (auto <= AlphaBetaModel(algorithm=alg).transfer_ns(df)).all()


def test_calibration_recovers_alpha_beta_and_the_total():
    df = synthetic()
    m = calibrate(df)
    assert m.notes == []
    for pg, (al, be, p, h) in TRUTH.items():
        fit = m.classes[f"pg:{pg}"]
        assert fit.alpha_source == "fit"
        assert fit.alpha_ns == pytest.approx(al, rel=0.03)
        assert fit.beta_ns_per_byte == pytest.approx(be, rel=0.03)
        assert fit.link_class == ("inter_node" if h > 1 else "intra_node")
    pred = m.transfer_ns(df)
    measured = df["measured_transfer_ns"].to_numpy()
    assert abs(pred.sum() / measured.sum() - 1) < 0.02
    assert WhatIfComm(m, mode="absolute").transfer_ns(df).tolist() == pred.tolist()


def test_single_size_class_takes_pooled_alpha_and_says_so():
    df = synthetic()
    al, be, p = 9e3, 1 / 100, 4
    single = frame([dict(op="all_reduce", bytes=1 << 22, group_size=p, n_hosts=2, pg_name="9",
                         measured_transfer_ns=round(ring_ns("all_reduce", p, 1 << 22, al, be)))] * 3)
    m = calibrate(pd.concat([df, single], ignore_index=True))
    fit = m.classes["pg:9"]
    assert fit.alpha_source == "pooled"
    pooled = np.average([m.classes["pg:0"].alpha_ns, m.classes["pg:2"].alpha_ns],
                        weights=[m.classes["pg:0"].n_rows, m.classes["pg:2"].n_rows])  # same link class first
    assert fit.alpha_ns == pytest.approx(pooled)
    assert any("pg:9" in n and "pooled" in n for n in m.notes)
    # the beta fitted alone reproduces the class's measured time
    assert 6 * fit.alpha_ns + 1.5 * (1 << 22) * fit.beta_ns_per_byte == pytest.approx(single["measured_transfer_ns"][0], rel=1e-6)

    alone = calibrate(single)
    assert alone.classes["pg:9"].alpha_source == "zero" and alone.classes["pg:9"].alpha_ns == 0.0
    assert any("alpha = 0" in n for n in alone.notes)


def test_class_key_is_pg_name_else_size_and_hosts():
    df = frame([dict(op="all_reduce", bytes=1, group_size=4, n_hosts=2, pg_name="3", measured_transfer_ns=1),
                dict(op="all_gather", bytes=1, group_size=4, n_hosts=2, pg_name=None, measured_transfer_ns=1),
                dict(op="all_reduce", bytes=1, group_size=4, n_hosts=None, pg_name=None, measured_transfer_ns=1)])
    assert class_keys(df).tolist() == ["pg:3", "size4/hosts2", "size4/hosts?"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS + ("broadcast", "all_to_all", "barrier", "send", "custom_op")),
                          st.one_of(st.none(), st.integers(1, 1 << 30)), st.sampled_from([1, 2, 4, 8, 16]),
                          st.sampled_from(["0", "1", None]), st.integers(0, 10 ** 12)), min_size=1, max_size=30),
       st.sampled_from(["ring", "tree"]))
def test_unchanged_what_if_returns_measured_bit_identically(rows, alg):
    df = frame([dict(op=o, bytes=b, group_size=p, n_hosts=2 if p > 4 else 1, pg_name=pg, measured_transfer_ns=t)
                for o, b, p, pg, t in rows])
    base = calibrate(synthetic(reps=1), algorithm=alg)
    got = WhatIfComm(base).transfer_ns(df, np.random.default_rng(0))
    assert got.dtype == np.int64
    assert got.tolist() == df["measured_transfer_ns"].tolist()


def test_bandwidth_scale_shrinks_only_the_beta_part():
    df = synthetic(reps=1)
    m = calibrate(df)
    k = 4.0
    got = WhatIfComm(m, bandwidth_scale=k).transfer_ns(df)
    measured = df["measured_transfer_ns"].to_numpy(dtype=float)
    for i, row in df.iterrows():
        fit = m.classes[f"pg:{row.pg_name}"]
        p, n = row.group_size, float(row.bytes)
        a_part = ring_ns(row.op, p, 0.0, fit.alpha_ns, 0.0)
        b_part = ring_ns(row.op, p, n, 0.0, fit.beta_ns_per_byte)
        assert got[i] == round(measured[i] * (a_part + b_part / k) / (a_part + b_part))
    assert (got <= measured).all()
    # the larger the message, the closer to 1/k (bandwidth-bound); the smallest barely change
    ratio = got / measured
    for _, grp in df.groupby(["pg_name", "op"]):
        r = ratio[grp.sort_values("bytes").index.to_numpy()]
        assert (np.diff(r) <= 1e-3).all() and r[0] > 0.95 and r[-1] < 0.5
    big = (df["bytes"] == df["bytes"].max()) & (df["pg_name"] == "0")  # 64 MiB at 40 GB/s
    al, be, p, _ = TRUTH["0"]
    a_true, b_true = 2 * (p - 1) * al, 2 * (p - 1) / p * (1 << 26) * be  # all_reduce; the gathers: same ratio
    assert np.allclose(ratio[big.to_numpy()], (a_true + b_true / k) / (a_true + b_true), rtol=0.02)
    lat = WhatIfComm(m, latency_scale=0.5).transfer_ns(df)
    assert (lat <= measured).all()
    assert np.allclose(lat[big.to_numpy()] / measured[big.to_numpy()], (a_true / 2 + b_true) / (a_true + b_true), rtol=0.02)


def test_rows_without_bytes_scale_measured_minus_alpha():
    m = calibrate(synthetic(reps=1))
    fit = m.classes["pg:0"]
    a_part = 2 * 7 * fit.alpha_ns  # all_reduce over 8 ranks
    df = frame([dict(op="all_reduce", bytes=None, group_size=8, n_hosts=2, pg_name="0", measured_transfer_ns=t)
                for t in (5_000_000, int(a_part / 2))])
    got = WhatIfComm(m, bandwidth_scale=2.0).transfer_ns(df)
    assert got[0] == round(a_part + (5_000_000 - a_part) / 2)
    assert got[1] == int(a_part / 2)  # shorter than alpha: all latency, bandwidth changes nothing
    # absolute mode implies the bytes from the fit: unchanged parameters give the measured time back
    assert WhatIfComm(m, mode="absolute").transfer_ns(df)[0] == 5_000_000


def test_link_override_and_unmodelled_ops():
    m = calibrate(synthetic(reps=1))
    df = frame([dict(op="all_reduce", bytes=1 << 26, group_size=8, n_hosts=2, pg_name="0", measured_transfer_ns=10 ** 7),
                dict(op="all_reduce", bytes=1 << 26, group_size=8, n_hosts=1, pg_name="1", measured_transfer_ns=10 ** 7),
                dict(op="weird_op", bytes=1 << 26, group_size=8, n_hosts=2, pg_name="0", measured_transfer_ns=10 ** 7)])
    fit = m.classes["pg:0"]
    got = WhatIfComm(m, links={"inter_node": LinkOverride(bandwidth_gbps=fit.bandwidth_gbps * 2)}).transfer_ns(df)
    a_part = 14 * fit.alpha_ns
    b_part = 2 * 7 / 8 * (1 << 26) * fit.beta_ns_per_byte
    assert got[0] == round(1e7 * (a_part + b_part / 2) / (a_part + b_part))
    assert got[1] == 10 ** 7 and got[2] == 10 ** 7  # intra-node link untouched; unknown op kept


def test_calibrate_from_nccl_tests_rows():
    al, be, p = 15e3, 1 / 45, 16
    sizes = 2 ** np.arange(12, 30)
    t_us = [ring_ns("all_reduce", p, float(n), al, be) / 1e3 for n in sizes]
    df = pd.DataFrame({"op": "all_reduce", "size_bytes": sizes, "count": sizes // 4, "dtype": "float",
                       "redop": "sum", "root": -1, "time_us": t_us, "algbw_gbps": sizes / np.array(t_us) / 1e3,
                       "busbw_gbps": 0.0, "in_place": False, "nwrong": 0, "source_file": "x.json"})
    m = calibrate_nccl_tests(df, group_size=p, n_hosts=2)
    assert m.link_sources["inter_node"] == "fit"
    assert m.links["inter_node"].latency_us == pytest.approx(15.0, rel=1e-3)
    assert m.links["inter_node"].bandwidth_gbps == pytest.approx(45.0, rel=1e-3)
    assert "nccl-tests" in m.notes[0]
    # a run's collective of another group falls back to the calibrated link class
    run = frame([dict(op="all_reduce", bytes=1 << 24, group_size=p, n_hosts=2, pg_name="7", measured_transfer_ns=1)])
    assert m.transfer_ns(run)[0] == round(ring_ns("all_reduce", p, 1 << 24, al, be))


def test_measured_and_determinism():
    df = synthetic(reps=1)
    assert MeasuredComm().transfer_ns(df).tolist() == df["measured_transfer_ns"].tolist()
    m = calibrate(df)
    a = WhatIfComm(m, bandwidth_scale=3, algorithm="auto").transfer_ns(df, np.random.default_rng(1))
    b = WhatIfComm(calibrate(df), bandwidth_scale=3, algorithm="auto").transfer_ns(df, np.random.default_rng(2))
    assert a.tolist() == b.tolist()


def test_invalid_parameters_are_refused():
    m = calibrate(synthetic(reps=1))
    with pytest.raises(ValueError):
        WhatIfComm(m, bandwidth_scale=0)
    with pytest.raises(ValueError):
        WhatIfComm(m, bandwidth_scale=True)
    assert WhatIfComm(m, bandwidth_scale=np.float64(2.0), latency_scale=np.int64(1)).bandwidth_scale == 2.0
    with pytest.raises(ValueError):
        WhatIfComm(m, algorithm="butterfly")
    with pytest.raises(ValueError):
        Link(bandwidth_gbps=-1.0, latency_us=1.0)
    with pytest.raises(ValueError):
        calibrate(synthetic(reps=1), algorithm="hierarchical")
    assert math.isfinite(m.links["inter_node"].bandwidth_gbps)


def test_empty_frame_gives_empty_int64():
    empty = frame([dict(op="all_reduce", bytes=1, group_size=2, n_hosts=1, pg_name=None, measured_transfer_ns=1)]).iloc[:0]
    m = calibrate(empty)
    assert any("default" in n for n in m.notes)
    for model in (MeasuredComm(), AlphaBetaModel(), m, WhatIfComm(m, bandwidth_scale=2.0)):
        got = model.transfer_ns(empty)
        assert got.dtype == np.int64 and len(got) == 0


def test_a_wild_outlier_is_left_out_of_the_fit():
    df = synthetic(reps=1)
    clean = calibrate(df).classes["pg:0"]
    bad = df.copy()
    i = int(np.flatnonzero((bad["pg_name"] == "0").to_numpy())[-1])  # the 64 MiB all_reduce, ~3 ms
    bad.loc[i, "measured_transfer_ns"] = 2_000  # a glitch: 2 us
    m = calibrate(bad)
    fit = m.classes["pg:0"]
    assert fit.n_rows == clean.n_rows - 1
    assert fit.alpha_ns == pytest.approx(clean.alpha_ns, rel=0.02)
    assert fit.beta_ns_per_byte == pytest.approx(clean.beta_ns_per_byte, rel=0.02)
    assert any("pg:0" in n and "left out" in n for n in m.notes)
    assert calibrate(df).notes == []  # 1% noise never trims
