"""Failures over a long training job (domain.md section 6): expected time to train and goodput under a
failure process and a recovery strategy, analytically and by seeded Monte Carlo.

Failure process: every GPU fails independently at rate 1 / MTBF_gpu, so the job sees a Poisson
process of rate lambda = n_gpus / (MTBF_gpu hours x 3600) (Llama 3 405B: 16,384 GPUs, 50,700 GPU-hours
-> one interruption every ~3.1 h). Each failure is either a rollback (back to the last checkpoint) with
probability q, or absorbed (the job continues) with probability 1 - q; by Poisson thinning these are
independent processes of rates q lambda and (1 - q) lambda.

The job: useful work W = target_steps x step time; strategies that compute redundantly do W (1 + o).
That work runs in segments of tau work seconds, each followed by a checkpoint of C seconds.

- A rollback failure during a segment (work or checkpoint) loses the segment so far and costs a restart
  of R seconds; a failure during the restart restarts it (Daly's model). Per segment of L = tau + C:
  exposed time E = (e^{q lambda L} - 1) / (q lambda), rollbacks q lambda E, lost work E - L, and each
  rollback's restart takes (e^{lambda R} - 1) / lambda in expectation (R when nothing strikes).
- An absorbed failure pauses the job for the failover F, loses the step in flight (half a step on
  average) and, for live migration, leaves one of `replicas` data-parallel replicas out for the repair
  time: throughput (k - 1)/k meanwhile, i.e. repair_time / replicas seconds of full-throughput time per
  failure. Absorbed failures strike during exposed time; pauses are not exposed (second order).

Strategies (constructors below; defaults and their sources in docs/whatif_models.md):
- checkpoint_restart: q = 1; checkpoint to remote storage, C = 60 s, R = 600 s.
- in_memory (Gemini, SOSP'23): q = 1; checkpoints to host memory of peers, C = 1 s, recovery 13x
  faster than from remote storage (R = 600 / 13 s).
- live_migration (Oobleck SOSP'23, Parcae NSDI'24): q = 0 (no rollback, no checkpoints); each failure
  costs a reconfiguration pause and reduced throughput until the node is repaired.
- redundant (Bamboo NSDI'23): steady overhead o of redundant computation; a failure is absorbed unless
  its redundancy partner (partner_gpus) is already down: q = 1 - exp(-partner_gpus x lambda_gpu x
  repair_time); then it rolls back to a (rare) checkpoint.

Breakdown (seconds, summing to the wall time): useful, redundancy (W o), checkpoint (completed
checkpoints x C), lost_work (rolled-back time + half a step per absorbed failure), recovery (restarts
+ failover pauses), degraded (reduced-throughput time of live migration).
goodput = useful / wall. effective training time % = time spent computing training steps
(useful + redundancy + lost work + degraded) / wall: what the job was running, whether or not it was
kept; checkpoints, restarts and pauses are not training.

The Monte Carlo draws the same process exactly (negative binomial counts of failed attempts,
truncated-exponential lost times, Poisson absorbed failures given the exposed time), so its mean agrees
with the analytic expectation within its confidence interval; nothing reads the clock.
"""
from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import asdict, dataclass, field

import numpy as np

STRATEGIES = ("checkpoint_restart", "in_memory", "live_migration", "redundant")
DEFAULT_STRATEGY = "checkpoint_restart"
DEFAULT_TRIALS = 400               # Monte Carlo trials per goodput estimate
DEFAULT_MTBF_GPU_HOURS = 50_700.0  # Llama 3 405B: 16,384 GPUs, ~3.1 h between interruptions
GEMINI_RECOVERY_SPEEDUP = 13.0     # Gemini (SOSP'23): recovery 13x faster than from remote storage
GPUS_PER_REPLICA_LLAMA3 = 128      # Llama 3 405B: TP 8 x PP 16 per data-parallel replica

_MAX_DRAWS = 20_000_000


def _pos(v, what, allow_zero=True, allow_inf=False):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v):
        raise ValueError(f"{what} must be a number, got {v!r}")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{what} must be finite, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Strategy:
    """A recovery strategy as the parameters of the model above."""
    kind: str
    checkpoint_interval_s: float | None = None  # work seconds between checkpoints; None: optimal; inf: none
    checkpoint_cost_s: float = 60.0
    restart_cost_s: float = 600.0
    rollback_fraction: float | None = 1.0       # q; None: from the redundancy partner (redundant)
    failover_cost_s: float = 0.0                # pause per absorbed failure
    repair_time_s: float = 0.0                  # until a failed node is back
    replicas: int | None = None                 # data-parallel replicas (live migration); None: n_gpus / 128
    redundancy_overhead: float = 0.0            # o: steady extra computation
    partner_gpus: int = 8                       # GPUs whose failure during a repair is fatal (redundant)
    degrade_throughput: bool = False            # live migration: run on fewer replicas until repaired

    def __post_init__(self):
        if self.kind not in STRATEGIES:
            raise ValueError(f"strategy {self.kind!r}; allowed: {', '.join(STRATEGIES)}")
        if self.checkpoint_interval_s is not None:
            _pos(self.checkpoint_interval_s, "checkpoint_interval_s", allow_zero=False, allow_inf=True)
        for name in ("checkpoint_cost_s", "restart_cost_s", "failover_cost_s", "repair_time_s", "redundancy_overhead"):
            _pos(getattr(self, name), name)
        if self.rollback_fraction is not None and not 0.0 <= self.rollback_fraction <= 1.0:
            raise ValueError(f"rollback_fraction must be in [0, 1], got {self.rollback_fraction!r}")
        if self.replicas is not None and (not isinstance(self.replicas, int) or self.replicas < 1):
            raise ValueError(f"replicas must be an integer >= 1, got {self.replicas!r}")
        if not isinstance(self.partner_gpus, int) or self.partner_gpus < 1:
            raise ValueError(f"partner_gpus must be an integer >= 1, got {self.partner_gpus!r}")


def checkpoint_restart(checkpoint_interval_s: float | None = None, checkpoint_cost_s: float = 60.0,
                       restart_cost_s: float = 600.0) -> Strategy:
    return Strategy("checkpoint_restart", checkpoint_interval_s, checkpoint_cost_s, restart_cost_s, 1.0)


def in_memory(checkpoint_interval_s: float | None = None, checkpoint_cost_s: float = 1.0,
              restart_cost_s: float = 600.0 / GEMINI_RECOVERY_SPEEDUP) -> Strategy:
    return Strategy("in_memory", checkpoint_interval_s, checkpoint_cost_s, restart_cost_s, 1.0)


def live_migration(failover_cost_s: float = 60.0, repair_time_s: float = 4 * 3600.0, replicas: int | None = None,
                   rollback_fraction: float = 0.0, checkpoint_interval_s: float | None = None,
                   checkpoint_cost_s: float = 60.0, restart_cost_s: float = 600.0) -> Strategy:
    return Strategy("live_migration", checkpoint_interval_s, checkpoint_cost_s, restart_cost_s, rollback_fraction,
                    failover_cost_s=failover_cost_s, repair_time_s=repair_time_s, replicas=replicas,
                    degrade_throughput=True)


def redundant(redundancy_overhead: float = 0.10, failover_cost_s: float = 10.0, repair_time_s: float = 4 * 3600.0,
              partner_gpus: int = 8, checkpoint_interval_s: float | None = None, checkpoint_cost_s: float = 60.0,
              restart_cost_s: float = 600.0) -> Strategy:
    return Strategy("redundant", checkpoint_interval_s, checkpoint_cost_s, restart_cost_s, None,
                    failover_cost_s=failover_cost_s, repair_time_s=repair_time_s,
                    redundancy_overhead=redundancy_overhead, partner_gpus=partner_gpus)


_CONSTRUCTORS = {"checkpoint_restart": checkpoint_restart, "in_memory": in_memory,
                 "live_migration": live_migration, "redundant": redundant}


def strategy_parameters(kind: str) -> tuple[str, ...]:
    """The parameters a strategy takes (its constructor's), in their order."""
    return tuple(inspect.signature(_CONSTRUCTORS[kind]).parameters)


def make_strategy(kind: str, **params) -> Strategy:
    """A strategy by name with its defaults, any parameter of its constructor overridden."""
    if kind not in _CONSTRUCTORS:
        raise ValueError(f"strategy {kind!r}; allowed: {', '.join(STRATEGIES)}")
    return _CONSTRUCTORS[kind](**params)


# ---------------------------------------------------------------------------------------------------
# Analytic model


def _exposed(lam_r: float, L: float) -> float:
    """Expected exposed time (work + checkpoint + lost) to complete a segment of length L."""
    return math.expm1(lam_r * L) / lam_r if lam_r > 0 else L


def _restart_time(lam: float, R: float) -> float:
    """Expected time to complete a restart of R seconds when a failure restarts it."""
    return math.expm1(lam * R) / lam if lam > 0 else R


def _waste_per_work(tau: float, C: float, lam_r: float) -> float:
    # expected segment time per second of work; the restart factor e^{lambda R} multiplies every segment
    # alike and so does not move the optimum
    return _exposed(lam_r, tau + C) / tau


def _minimise_interval(C: float, lam_r: float) -> float:
    """argmin over tau of the expected segment time per work second (golden section on log tau)."""
    if lam_r <= 0:
        return math.inf
    if C <= 0:
        return 0.0
    M = 1.0 / lam_r
    lo, hi = math.log(1e-6 * min(C, M)), math.log(100.0 * M + 100.0 * C)
    g = (math.sqrt(5) - 1) / 2
    f = lambda x: _waste_per_work(math.exp(x), C, lam_r)  # noqa: E731
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
        if b - a < 1e-12:
            break
    return math.exp((a + b) / 2)


def optimal_checkpoint_interval(checkpoint_cost_s: float, mtbf_s: float, restart_cost_s: float = 0.0) -> float:
    """Checkpoint interval (work seconds between checkpoints) that minimises the model's expected
    waste, found numerically. Compare Young/Daly sqrt(2 C M), its first-order approximation.
    restart_cost_s is accepted for completeness: in this model a restart scales every segment's
    expected time by the same e^{R / M} and leaves the optimum where it is."""
    C = _pos(checkpoint_cost_s, "checkpoint_cost_s")
    M = _pos(mtbf_s, "mtbf_s", allow_zero=False, allow_inf=True)
    _pos(restart_cost_s, "restart_cost_s")
    return _minimise_interval(C, 0.0 if math.isinf(M) else 1.0 / M)


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


@dataclass
class GoodputResult:
    strategy: str
    n_gpus: int
    mtbf_job_s: float                 # mean time between failures of the whole job
    checkpoint_interval_s: float      # work seconds between checkpoints (inf: no checkpoints)
    rollback_fraction: float
    expected_failures: float          # including failures that strike a restart
    time_to_train_s: float            # analytic expectation of the wall time
    goodput: float                    # useful / wall
    effective_training_time_pct: float
    breakdown_s: dict                 # useful, redundancy, checkpoint, lost_work, recovery, degraded
    mc_trials: int
    mc_time_to_train_s: float
    mc_ci95_s: float                  # half-width of the 95% confidence interval of the MC mean
    mc_std_s: float
    mc_goodput: float
    mc_breakdown_s: dict
    mc_failures: float                # mean failures per trial
    seed: int
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Setup:
    W: float
    work: float
    step_s: float
    lam: float
    lam_r: float
    lam_a: float
    tau: float
    C: float
    R: float
    F: float               # failover pause per absorbed failure
    D: float               # full-throughput seconds lost to a reduced replica count per absorbed failure
    n_full: int
    L1: float
    L2: float              # last segment (0: none)
    n_ckpt: int            # checkpoints taken (every segment ends with one unless there are none)
    q: float


def _setup(step_ns, target_steps, n_gpus, st: Strategy, mtbf_gpu_hours) -> _Setup:
    step_s = _pos(step_ns, "step_ns", allow_zero=False) / 1e9
    if isinstance(target_steps, bool) or not isinstance(target_steps, (int, np.integer)) or target_steps < 1:
        raise ValueError(f"target_steps must be an integer >= 1, got {target_steps!r}")
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, (int, np.integer)) or n_gpus < 1:
        raise ValueError(f"n_gpus must be an integer >= 1, got {n_gpus!r}")
    mtbf_gpu_s = _pos(mtbf_gpu_hours, "mtbf_gpu_hours", allow_zero=False, allow_inf=True) * 3600.0
    lam_gpu = 0.0 if math.isinf(mtbf_gpu_s) else 1.0 / mtbf_gpu_s
    lam = n_gpus * lam_gpu
    q = st.rollback_fraction
    if q is None:  # redundant: fatal when the partner is already down
        q = -math.expm1(-st.partner_gpus * lam_gpu * st.repair_time_s)
    lam_r, lam_a = q * lam, (1.0 - q) * lam
    W = step_s * int(target_steps)
    work = W * (1.0 + st.redundancy_overhead)
    C = st.checkpoint_cost_s
    tau = st.checkpoint_interval_s
    if tau is None:
        tau = _minimise_interval(C, lam_r)
    if math.isinf(tau):  # no checkpoints: one segment, the whole job
        n_full, L1, L2, n_ckpt = 0, 0.0, work, 0
    elif tau >= work:
        n_full, L1, L2, n_ckpt = 0, 0.0, work + C, 1
    else:
        tau = max(tau, step_s)  # a checkpoint falls between steps: never more often than every step
        n_full = int(work // tau)
        rem = work - n_full * tau
        L1, L2 = tau + C, (rem + C if rem > 1e-9 * work else 0.0)
        n_ckpt = n_full + (1 if L2 > 0 else 0)
    replicas = st.replicas if st.replicas is not None else max(1, int(n_gpus) // GPUS_PER_REPLICA_LLAMA3)
    D = st.repair_time_s / replicas if st.degrade_throughput else 0.0
    if lam_r * max(L1, L2) > 40:
        raise ValueError(f"a checkpoint segment of {max(L1, L2):.3g} s against a mean time between failures of "
                         f"{1 / lam_r:.3g} s almost never completes: shorten checkpoint_interval_s")
    return _Setup(W=W, work=work, step_s=step_s, lam=lam, lam_r=lam_r, lam_a=lam_a, tau=tau, C=C, R=st.restart_cost_s,
                  F=st.failover_cost_s, D=D, n_full=n_full, L1=L1, L2=L2,
                  n_ckpt=n_ckpt, q=q)


def _analytic(s: _Setup) -> dict:
    X = s.n_full * _exposed(s.lam_r, s.L1) + (_exposed(s.lam_r, s.L2) if s.L2 > 0 else 0.0)
    n_rb = s.lam_r * X
    n_ab = s.lam_a * X
    checkpoint = s.n_ckpt * s.C
    lost_rb = X - (s.n_full * s.L1 + s.L2)
    return {"useful": s.W, "redundancy": s.work - s.W, "checkpoint": checkpoint,
            "lost_work": lost_rb + n_ab * s.step_s / 2, "recovery": n_rb * _restart_time(s.lam, s.R) + n_ab * s.F,
            "degraded": n_ab * s.D, "_failures": n_rb * math.exp(s.lam * s.R) + n_ab}  # incl. failed restarts


def _trunc_exp(rng, lam: float, L: float, size: int) -> np.ndarray:
    """Exponential(lam) conditioned on < L, by inversion."""
    u = rng.random(size)
    return -np.log1p(u * np.expm1(-lam * L)) / lam


def _per_trial_sum(trials: int, counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.bincount(np.repeat(np.arange(trials), counts), weights=values, minlength=trials)


def _monte_carlo(s: _Setup, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    zeros = np.zeros(trials)
    lost = zeros.copy()
    k_total = np.zeros(trials, dtype=np.int64)
    if s.lam_r > 0:
        for n_seg, L in ((s.n_full, s.L1), (1, s.L2)):
            if n_seg == 0 or L <= 0:
                continue
            k = rng.negative_binomial(n_seg, math.exp(-s.lam_r * L), size=trials)
            if k.sum() > _MAX_DRAWS:
                raise ValueError("too many failures to simulate: the job barely progresses under these parameters")
            lost += _per_trial_sum(trials, k, _trunc_exp(rng, s.lam_r, L, int(k.sum())))
            k_total += k
    restart = k_total * s.R
    j = np.zeros(trials, dtype=np.int64)
    if s.lam > 0 and s.R > 0 and k_total.any():
        has = k_total > 0
        j[has] = rng.negative_binomial(k_total[has], math.exp(-s.lam * s.R))
        restart = restart + _per_trial_sum(trials, j, _trunc_exp(rng, s.lam, s.R, int(j.sum())))
    X = s.n_full * s.L1 + s.L2 + lost
    n_ab = rng.poisson(s.lam_a * X) if s.lam_a > 0 else np.zeros(trials, dtype=np.int64)
    if n_ab.sum() > _MAX_DRAWS:
        raise ValueError("too many failures to simulate: the job barely progresses under these parameters")
    half_steps = _per_trial_sum(trials, n_ab, rng.random(int(n_ab.sum())) * s.step_s)
    checkpoint = s.n_ckpt * s.C
    return {"useful": np.full(trials, s.W), "redundancy": np.full(trials, s.work - s.W),
            "checkpoint": np.full(trials, checkpoint), "lost_work": lost + half_steps,
            "recovery": restart + n_ab * s.F, "degraded": n_ab * s.D, "_failures": (k_total + j + n_ab).astype(float)}


_PARTS = ("useful", "redundancy", "checkpoint", "lost_work", "recovery", "degraded")


def goodput(step_ns: float, target_steps: int, n_gpus: int, strategy: str | Strategy = DEFAULT_STRATEGY,
            mtbf_gpu_hours: float = DEFAULT_MTBF_GPU_HOURS, seed: int = 0,
            trials: int = DEFAULT_TRIALS) -> GoodputResult:
    """Expected time to train target_steps steps of step_ns each on n_gpus GPUs under failures, the
    goodput and effective training time, and their breakdown, analytic and by Monte Carlo (seeded)."""
    st = make_strategy(strategy) if isinstance(strategy, str) else strategy
    if not isinstance(st, Strategy):
        raise TypeError("strategy must be a name or a Strategy")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 2:
        raise ValueError(f"trials must be an integer >= 2, got {trials!r}")
    s = _setup(step_ns, target_steps, n_gpus, st, mtbf_gpu_hours)
    a = _analytic(s)
    wall = sum(a[p] for p in _PARTS)
    mc = _monte_carlo(s, trials, np.random.default_rng(seed))
    mc_wall = sum(mc[p] for p in _PARTS)
    training = ("useful", "redundancy", "lost_work", "degraded")
    notes = []
    if st.kind == "live_migration" and s.D > 0:
        notes.append("reduced throughput counted as repair_time / replicas of full-throughput time per failure")
    if st.checkpoint_interval_s is None:
        if s.lam_r > 0 and not math.isinf(s.tau):
            notes.append(f"checkpoint interval {s.tau:.4g} s: the model's optimum (Young/Daly sqrt(2CM): "
                         f"{young_daly_interval(s.C, 1 / s.lam_r):.4g} s)")
        elif math.isinf(s.tau):
            notes.append("no rollback failures: no checkpoints")
    return GoodputResult(
        strategy=st.kind, n_gpus=int(n_gpus), mtbf_job_s=(1.0 / s.lam if s.lam > 0 else math.inf),
        checkpoint_interval_s=s.tau,
        rollback_fraction=s.q, expected_failures=a["_failures"], time_to_train_s=wall, goodput=s.W / wall,
        effective_training_time_pct=100.0 * sum(a[p] for p in training) / wall,
        breakdown_s={p: a[p] for p in _PARTS}, mc_trials=trials, mc_time_to_train_s=float(mc_wall.mean()),
        mc_ci95_s=float(1.96 * mc_wall.std(ddof=1) / math.sqrt(trials)), mc_std_s=float(mc_wall.std(ddof=1)),
        mc_goodput=float(np.mean(s.W / mc_wall)), mc_breakdown_s={p: float(mc[p].mean()) for p in _PARTS},
        mc_failures=float(mc["_failures"].mean()),
        seed=int(seed), notes=notes)
