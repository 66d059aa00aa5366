"""Failure model (replay/failures.py): the numeric checkpoint optimum against Young/Daly, a
Llama-3-like job against Meta's reported effective training time, Monte Carlo against the analytic
expectation, and the accounting identities."""
from __future__ import annotations

import math

import numpy as np
import pytest

from replay.failures import (STRATEGIES, Strategy, _waste_per_work, checkpoint_restart, goodput, in_memory,
                             live_migration, make_strategy, optimal_checkpoint_interval, redundant,
                             young_daly_interval)

# Llama 3 405B (domain.md section 6): 16,384 GPUs, per-GPU MTBF 50,700 h -> job MTBF ~3.1 h, 54 days.
# Step 4.2 s x 1,000,000 steps = 48.6 days of useful work (our choice, to land near the 54 days).
LLAMA = dict(step_ns=4.2e9, target_steps=1_000_000, n_gpus=16_384, mtbf_gpu_hours=50_700.0)
JOB_MTBF_S = 50_700.0 * 3600 / 16_384


@pytest.mark.parametrize("C,M", [(10.0, 1e5), (60.0, JOB_MTBF_S), (5.0, 1e4), (1.0, 3600.0)])
def test_numeric_optimum_agrees_with_young_daly_when_checkpoints_are_cheap(C, M):
    assert C / M <= 0.006  # the regime where sqrt(2CM) is meant to hold
    t = optimal_checkpoint_interval(C, M)
    assert abs(t / young_daly_interval(C, M) - 1) < 0.05
    # and it is a minimum of the model's waste
    lam = 1 / M
    assert _waste_per_work(t, C, lam) <= min(_waste_per_work(t * 0.9, C, lam), _waste_per_work(t * 1.1, C, lam))


def test_young_daly_drifts_when_checkpoints_are_expensive():
    t = optimal_checkpoint_interval(1800.0, 3600.0)  # C = M / 2: first-order formula no longer applies
    assert abs(t / young_daly_interval(1800.0, 3600.0) - 1) > 0.2
    assert optimal_checkpoint_interval(60.0, math.inf) == math.inf
    assert optimal_checkpoint_interval(0.0, 3600.0) == 0.0


def test_llama3_like_effective_training_time():
    r = goodput(**LLAMA, strategy=checkpoint_restart(checkpoint_cost_s=60.0, restart_cost_s=600.0), seed=0)
    assert r.mtbf_job_s / 3600 == pytest.approx(3.09, abs=0.01)
    assert 85.0 <= r.effective_training_time_pct <= 95.0        # Meta reported > 90%
    assert 0.80 <= r.goodput <= 0.95
    assert 380 <= r.expected_failures <= 460                     # 419 unexpected interruptions in 54 days
    assert 50 <= r.time_to_train_s / 86400 <= 62                 # the run took 54 days
    assert r.checkpoint_interval_s == pytest.approx(optimal_checkpoint_interval(60.0, JOB_MTBF_S))


@pytest.mark.parametrize("kind", STRATEGIES)
def test_monte_carlo_mean_within_its_confidence_interval(kind):
    r = goodput(step_ns=4.2e9, target_steps=200_000, n_gpus=16_384, strategy=kind, seed=7, trials=3000)
    assert abs(r.mc_time_to_train_s - r.time_to_train_s) <= r.mc_ci95_s
    assert r.mc_failures == pytest.approx(r.expected_failures, rel=0.02)
    for part, v in r.breakdown_s.items():  # rare rollbacks (redundant) make single parts noisy: 0.5% of wall
        assert r.mc_breakdown_s[part] == pytest.approx(v, abs=0.005 * r.time_to_train_s)


def test_monte_carlo_confidence_interval_is_calibrated():
    inside = 0
    for seed in range(40):
        r = goodput(step_ns=4.2e9, target_steps=100_000, n_gpus=16_384, strategy="checkpoint_restart",
                    seed=seed, trials=200)
        inside += abs(r.mc_time_to_train_s - r.time_to_train_s) <= r.mc_ci95_s
    assert inside >= 34  # 95% nominal: 38 of 40 expected; a biased estimator would miss far more


def test_same_seed_same_result_other_seed_differs():
    a = goodput(**LLAMA, strategy="in_memory", seed=3, trials=100)
    b = goodput(**LLAMA, strategy="in_memory", seed=3, trials=100)
    c = goodput(**LLAMA, strategy="in_memory", seed=4, trials=100)
    assert a.to_dict() == b.to_dict()
    assert a.mc_time_to_train_s != c.mc_time_to_train_s
    assert a.time_to_train_s == c.time_to_train_s  # the analytic part has no randomness


@pytest.mark.parametrize("kind", STRATEGIES)
def test_breakdown_sums_to_wall_time(kind):
    r = goodput(**LLAMA, strategy=kind, trials=50)
    assert sum(r.breakdown_s.values()) == pytest.approx(r.time_to_train_s, rel=1e-12)
    assert r.breakdown_s["useful"] == pytest.approx(4.2e6)
    assert r.goodput == pytest.approx(4.2e6 / r.time_to_train_s)
    assert 0 < r.goodput <= 1 and 0 < r.effective_training_time_pct <= 100


def test_analytic_matches_daly_by_hand():
    # 10 segments of 100 s work + 10 s checkpoint, MTBF 1000 s, restart 50 s
    C, R, tau, M = 10.0, 50.0, 100.0, 1000.0
    st = checkpoint_restart(checkpoint_interval_s=tau, checkpoint_cost_s=C, restart_cost_s=R)
    r = goodput(step_ns=1e9, target_steps=1000, n_gpus=1, strategy=st, mtbf_gpu_hours=M / 3600, trials=20)
    per_segment = math.exp(R / M) * M * math.expm1((tau + C) / M)
    assert r.time_to_train_s == pytest.approx(10 * per_segment, rel=1e-12)
    assert r.breakdown_s["checkpoint"] == pytest.approx(100.0)
    rollbacks = 10 * math.expm1((tau + C) / M)
    assert r.expected_failures == pytest.approx(rollbacks * math.exp(R / M))  # + failed restarts
    # lost work per failure ~ half an interval when failures are rare within a segment
    lost_per_failure = r.breakdown_s["lost_work"] / rollbacks
    assert lost_per_failure == pytest.approx((tau + C) / 2, rel=0.05)


def test_no_failures_means_no_waste():
    r = goodput(step_ns=1e9, target_steps=1000, n_gpus=8, mtbf_gpu_hours=math.inf, trials=10)
    assert r.time_to_train_s == 1000.0 and r.goodput == 1.0 and r.expected_failures == 0
    assert r.mc_time_to_train_s == 1000.0
    fixed = goodput(step_ns=1e9, target_steps=1000, n_gpus=8, mtbf_gpu_hours=math.inf, trials=10,
                    strategy=checkpoint_restart(checkpoint_interval_s=100.0, checkpoint_cost_s=2.0))
    assert fixed.time_to_train_s == 1020.0 and fixed.breakdown_s["checkpoint"] == 20.0


def test_free_checkpoints_are_taken_every_step():
    r = goodput(step_ns=2e9, target_steps=5000, n_gpus=1024, strategy=checkpoint_restart(checkpoint_cost_s=0.0),
                trials=20)
    assert r.checkpoint_interval_s == 2.0 and r.breakdown_s["checkpoint"] == 0.0
    assert r.breakdown_s["lost_work"] / r.expected_failures < 1.0  # at most a step lost per failure


def test_strategies_order_as_expected():
    res = {k: goodput(**LLAMA, strategy=k, trials=20) for k in STRATEGIES}
    assert res["in_memory"].goodput > res["checkpoint_restart"].goodput
    assert res["live_migration"].breakdown_s["checkpoint"] == 0.0
    assert res["live_migration"].breakdown_s["degraded"] > 0
    assert res["redundant"].breakdown_s["redundancy"] == pytest.approx(0.10 * 4.2e6)
    assert 0 < res["redundant"].rollback_fraction < 1e-3  # double failures of partners are rare
    worse = goodput(**{**LLAMA, "mtbf_gpu_hours": 20_000.0}, trials=20)
    assert worse.goodput < res["checkpoint_restart"].goodput
    slower_restart = goodput(**LLAMA, strategy=checkpoint_restart(restart_cost_s=1800.0), trials=20)
    assert slower_restart.goodput < res["checkpoint_restart"].goodput


def test_live_migration_degraded_time_is_repair_over_replicas_per_failure():
    st = live_migration(failover_cost_s=30.0, repair_time_s=7200.0, replicas=64)
    r = goodput(**LLAMA, strategy=st, trials=20)
    assert r.breakdown_s["degraded"] == pytest.approx(r.expected_failures * 7200.0 / 64)
    assert r.breakdown_s["recovery"] == pytest.approx(r.expected_failures * 30.0)
    assert r.breakdown_s["lost_work"] == pytest.approx(r.expected_failures * 2.1)  # half a 4.2 s step


def test_invalid_inputs():
    with pytest.raises(ValueError):
        goodput(step_ns=0, target_steps=10, n_gpus=1)
    with pytest.raises(ValueError):
        goodput(step_ns=1e9, target_steps=0, n_gpus=1)
    with pytest.raises(ValueError):
        goodput(step_ns=1e9, target_steps=10, n_gpus=1, strategy="prayer")
    with pytest.raises(ValueError):
        Strategy("checkpoint_restart", checkpoint_cost_s=-1.0)
    with pytest.raises(ValueError):
        make_strategy("redundant", redundancy_overhead=float("nan"))
    with pytest.raises(ValueError, match="never completes"):
        goodput(step_ns=1e9, target_steps=10 ** 6, n_gpus=16_384, mtbf_gpu_hours=1.0,
                strategy=checkpoint_restart(checkpoint_interval_s=1e5))
    assert isinstance(in_memory(), Strategy) and isinstance(redundant(), Strategy)
    # numpy scalars, as the engine hands them over, are numbers too
    assert goodput(np.int64(4_200_000_000), np.int64(1000), np.int64(64), trials=2).goodput == \
        goodput(4.2e9, 1000, 64, trials=2).goodput
    assert np.isfinite(goodput(**LLAMA, trials=2).mc_ci95_s)
