"""The typed scenario: one frozen dataclass per section of a scenario file, each field one key with
its default and its check.

A field's default is the one statement of that key's default: the loader (replay/scenario.py) passes
only the keys a file gives, the validator's schema is derived from the fields (`schema`), and
docs/whatif_models.md's table is tested against them. A Scenario always has every section; an empty
section changes nothing. `optical` and `failures` are None when the file has no such section: their
presence is itself what they say (a circuit switch in the network, goodput figures wanted).

The models themselves are built by replay/factory.py; the methods here hand the specs to it.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from analyses.devices import DEFAULT_MEMORY_RESERVE_PCT

from . import factory
from .checks import (
    Bad,
    ScenarioError,
    boolean,
    fraction,
    globs,
    int_at_least,
    interval,
    non_negative,
    one_of,
    ordinals,
    percent,
    positive,
    rank_groups,
    rank_key,
    rank_list,
    regex,
    text,
)
from .compute import KERNEL_CLASSES, Speedup
from .relayout import PIPELINE_SCHEDULES, SHARDINGS
from .costs import ALGORITHMS, FLAT_ALGORITHMS, LINK_CLASSES, LinkOverride
from .failures import (
    DEFAULT_MTBF_GPU_HOURS,
    DEFAULT_STRATEGY,
    DEFAULT_TRIALS,
    STRATEGIES,
    GoodputResult,
    Strategy,
    goodput,
    make_strategy,
)
from .memory import CHECKPOINTING
from .network import CalibratedModel
from .optical import (
    DEFAULT_RECONFIG_DELAY_MS,
    EVERY_GROUP,
    SCHEDULES,
    OpticalModel,
    Phase,
)


def key(default=MISSING, check=None, *, make=MISSING, name: str | None = None, more: dict | None = None):
    """A field that is a file key: its default, its check (a rule of replay/checks.py), the key's name
    when it is not the field's, and keys that follow it in the file (a strategy's parameters)."""
    meta = {"check": check, "key": name, "more": more or {}}
    return field(default=default, default_factory=make, metadata=meta)


def schema(cls) -> dict:
    """The validator's rules for a section: {key: rule} in the fields' order."""
    out = {}
    for f in fields(cls):
        if f.metadata.get("check") is None:
            continue  # not a key of the section (the loader fills it in)
        out[f.metadata["key"] or f.name] = f.metadata["check"]
        out.update(f.metadata["more"])
    return out


# [network.links.<class>] -> LinkOverride
LINK_KEYS = {"bandwidth_gbps": positive, "latency_us": non_negative, "bandwidth_scale": positive}
HOST_KEYS = {"ranks": rank_list, "bandwidth_scale": positive}  # [[network.hosts]] -> HostOverride
SPEEDUP_KEYS = {"kernel_class": one_of(*KERNEL_CLASSES), "name": regex, "factor": positive}  # -> Speedup
PHASE_KEYS = {"match": globs, "circuits": globs, "ordinals": ordinals, "name": text}  # -> Phase
# a strategy's parameters; the defaults are the strategy's own (replay/failures.py constructors)
STRATEGY_PARAMETERS = {
    "checkpoint_interval_s": interval,
    "checkpoint_cost_s": non_negative,
    "restart_cost_s": non_negative,
    "failover_cost_s": non_negative,
    "repair_time_s": non_negative,
    "replicas": int_at_least(1),
    "redundancy_overhead": non_negative,
    "partner_gpus": int_at_least(1),
    "rollback_fraction": fraction,
}


@dataclass(frozen=True)
class HostOverride:
    """[[network.hosts]]: the NIC of the host(s) holding these ranks, both directions, relative to today."""
    ranks: tuple[int, ...]
    bandwidth_scale: float = 1.0


@dataclass(frozen=True)
class NetworkSpec:
    """[network]: how collectives are re-costed. The defaults keep the measured transfers."""
    bandwidth_scale: float = key(1.0, positive)
    latency_scale: float = key(1.0, positive)
    algorithm: str | None = key(None, one_of(*ALGORITHMS, "measured"))  # None: the calibration's
    calibrate: str = key("run", one_of("run", "nccl_tests", "none"))
    calibrate_algorithm: str = key("ring", one_of(*FLAT_ALGORITHMS))
    gpus_per_node: int | None = key(None, int_at_least(1))
    nccl_tests_group_size: int | None = key(None, int_at_least(1))
    nccl_tests_hosts: int = key(1, int_at_least(1))
    # link class -> LinkOverride as written (unscaled); 'optical' gives the circuits' defaults
    links: dict = key(check={c: LINK_KEYS for c in LINK_CLASSES}, make=dict)
    # links (the default): collectives as flows that share the links of the run's hosts (replay/links.py, fitted by
    # replay/linkfit.py); alpha_beta: each collective costed alone (replay/network.py), kept for comparison and for
    # what only it models (another algorithm, uncalibrated default links, optical circuits)
    model: str = key("links", one_of("alpha_beta", "links"))
    hosts: tuple[HostOverride, ...] = key((), ("array", HOST_KEYS))  # per-host NICs (the links model)
    # the run's NICs' rate as sold (GB/s; default: run.json's testbed rate): an [optical] circuit's rate is
    # relative to it (the links model gives circuits the efficiency the run's NICs reached)
    nic_bandwidth_gbps: float | None = key(None, positive)
    # the round trip between the run's hosts (us; default: run.json's testbed rtt_us): the links model's fitted
    # latency per step is at most this plus one frame's serialization; the rest is software (replay/linkfit.py)
    rtt_us: float | None = key(None, positive)

    @property
    def changes_network(self) -> bool:
        return (self.bandwidth_scale != 1.0 or self.latency_scale != 1.0 or bool(self.packet_links)
                or self.algorithm not in (None, "measured") or any(h.bandwidth_scale != 1.0 for h in self.hosts))

    @property
    def packet_links(self) -> dict[str, LinkOverride]:
        """The links of the packet-switched network (all but the optical circuits')."""
        return {c: v for c, v in self.links.items() if c != "optical"}


@dataclass(frozen=True)
class ComputeSpec:
    """[compute]: kernel speedups, per-rank slowdowns, CPU speed. The defaults keep measured durations."""
    cpu_scale: float = key(1.0, positive)
    speedup: tuple[Speedup, ...] = key((), ("array", SPEEDUP_KEYS))  # the first rule that matches applies
    rank_slowdown: dict[int, float] = key(check=("map", rank_key, positive), make=dict)


@dataclass(frozen=True)
class OpticalSpec:
    """[optical]: an optical circuit switch in the network (replay/optical.py)."""
    reconfig_delay_ms: float = key(DEFAULT_RECONFIG_DELAY_MS, non_negative)
    schedule: str = key("job", one_of(*SCHEDULES))  # the loader makes it 'phase' when phases are given
    # None: [network.links.optical], else the inner model's inter-node value (the loader resolves it)
    circuit_bandwidth_gbps: float | None = key(None, positive)
    circuit_latency_us: float | None = key(None, non_negative)
    circuits: tuple[str, ...] = key(EVERY_GROUP, globs)
    phases: tuple[Phase, ...] = key((), ("array", PHASE_KEYS), name="phase")
    gpus_per_node: int | None = None  # [network] gpus_per_node: tells multi-host groups apart

    @property
    def own_circuits(self) -> bool:
        """Whether the circuits have their own bandwidth or latency (they re-cost transfers)."""
        return self.circuit_bandwidth_gbps is not None or self.circuit_latency_us is not None

    def model(self, inner) -> OpticalModel:
        return factory.optical_model(self, inner)


@dataclass(frozen=True)
class FailuresSpec:
    """[failures]: a failure process and a recovery strategy over the whole job (replay/failures.py)."""
    mtbf_gpu_hours: float = key(DEFAULT_MTBF_GPU_HOURS, positive)
    n_gpus: int | None = key(None, int_at_least(1))  # None: the run's (x dp'/dp under [parallelism] dp)
    strategy: Strategy = key(check=one_of(*STRATEGIES), make=lambda: make_strategy(DEFAULT_STRATEGY),
                             more=STRATEGY_PARAMETERS)
    target_steps: int | None = key(None, int_at_least(1))  # None: the top-level steps (the loader resolves it)
    trials: int = key(DEFAULT_TRIALS, int_at_least(2))
    seed: int = 0  # the loader passes the scenario's seed

    def goodput(self, step_ns: float, target_steps: int | None = None, n_gpus: int | None = None,
                seed: int | None = None) -> GoodputResult:
        steps = target_steps or self.target_steps
        gpus = n_gpus or self.n_gpus
        if steps is None:
            raise ScenarioError("failures: target steps unknown: set [failures] target_steps or top-level steps")
        if gpus is None:
            raise ScenarioError("failures: GPU count unknown: set [failures] n_gpus or pass the run's")
        return goodput(step_ns, steps, gpus, self.strategy, mtbf_gpu_hours=self.mtbf_gpu_hours,
                       seed=self.seed if seed is None else seed, trials=self.trials)


# The largest [parallelism] dp. Each gradient collective of the resized group holds the list of its ranks, and
# the network models walk every one: memory and time grow as dp x those collectives (~150 B and ~40 us per rank
# per collective). Measured on ddp4_4hosts_100mbit (8 such collectives): dp 16,384 in 8.7 s and 0.40 GB peak,
# 262,144 in 11 s and 0.73 GB, 2^20 in 41 s and 1.7 GB; dp 10^8 would need ~120 GB. 2^20 is five times the
# largest GPU clusters built (~200k GPUs), so no real what-if is refused.
MAX_DP = 1 << 20


def _dp(v):
    v = int_at_least(1)(v)
    if v > MAX_DP:
        raise Bad(f"must be at most {MAX_DP:,} (2^20): the replay holds every rank of each gradient collective, "
                  f"about 150 B a rank ({v:,} ranks: {v * 150 / 1e9:,.1f} GB for each collective of the group)")
    return v


@dataclass(frozen=True)
class ParallelismSpec:
    """[parallelism]: new degrees; None keeps the run's. `dp` alone resizes the gradient collectives and keeps each
    rank's batch (replay/parallelism.py); any other key re-lays the run out from its traces with the global batch
    kept (replay/relayout.py), `dp` among them."""
    dp: int | None = key(None, _dp)
    tp: int | None = key(None, int_at_least(1))
    pp: int | None = key(None, int_at_least(1))
    micro_batches: int | None = key(None, int_at_least(1))
    schedule: str | None = key(None, one_of(*PIPELINE_SCHEDULES))  # the pipeline's: "gpipe" | "1f1b"
    # over dp: "none" | "zero1" | "zero2" | "fsdp" | "replicate" (FSDP2's: whole parameters, a copy per forward)
    sharding: str | None = key(None, one_of(*SHARDINGS))

    @property
    def changes_layout(self) -> bool:
        return any(v is not None for v in (self.dp, self.tp, self.pp, self.micro_batches, self.schedule,
                                           self.sharding))

    @property
    def relayout(self) -> bool:
        """A re-layout (replay/relayout.py), not `dp` alone."""
        return any(v is not None for v in (self.tp, self.pp, self.micro_batches, self.schedule, self.sharding))


@dataclass(frozen=True)
class MemorySpec:
    """[memory]: what the step keeps in device memory (replay/memory.py). The defaults keep the run's."""
    # "none" | "full" (every repeated block's forward recomputed in its backward); None: as the run did
    activation_checkpointing: str | None = key(None, one_of(*CHECKPOINTING))
    # the optimizer's state kept in host memory: in over the host link before the update, out after it, each step
    offload_optimizer: bool = key(False, boolean)
    # the host link (GB/s, one direction) the state crosses; None: the device catalog's for each rank's GPU
    host_link_gbps: float | None = key(None, positive)
    # the share of the device's memory a predicted peak must leave free to fit (NULL capacity: no verdict)
    reserve_pct: float = key(DEFAULT_MEMORY_RESERVE_PCT, percent)

    @property
    def changes_memory(self) -> bool:
        return self.activation_checkpointing is not None or self.offload_optimizer


@dataclass(frozen=True)
class BatchSpec:
    """[batch]: the global batch relative to the run's; each rank's tokens follow the layout (replay/memory.py)."""
    scale: float = key(1.0, positive)


@dataclass(frozen=True)
class TopologySpec:
    """[topology]: which ranks share a host, in place of what the run says (run.json's hosts, else the
    traces' host names); replay/topology.py applies it. One of the two keys, or neither (the run's)."""
    ranks_per_host: int | None = key(None, int_at_least(1))  # ranks 0..N-1 on host 0, N..2N-1 on host 1, ...
    hosts: tuple[tuple[int, ...], ...] | None = key(None, rank_groups)  # the ranks of each host

    @property
    def given(self) -> bool:
        return self.ranks_per_host is not None or self.hosts is not None


@dataclass(frozen=True)
class HardwareSpec:
    """[hardware]: the GPU the run is re-timed for (replay/hardware.py): a device of the catalog
    (analyses/device_catalog.toml, or the file `catalog` names), and/or its figures given here, which
    override the device's. Neither: the run's own GPU (nothing changes)."""
    gpu: str | None = key(None, text)  # a catalog device's name, or a deviceProperties-like name it matches
    from_gpu: str | None = key(None, text)  # None: the device each rank's trace names (deviceProperties)
    catalog: str | None = key(None, text)  # a device catalog TOML adding or overriding devices
    fp64_tflops: float | None = key(None, positive)
    fp32_tflops: float | None = key(None, positive)
    tf32_tflops: float | None = key(None, positive)
    bf16_tflops: float | None = key(None, positive)
    fp16_tflops: float | None = key(None, positive)
    fp8_tflops: float | None = key(None, positive)
    memory_gbps: float | None = key(None, positive)

    @property
    def given(self) -> bool:
        return self.gpu is not None or bool(self.own_figures)

    @property
    def own_figures(self) -> dict:
        """The figures the section gives itself: {dtype: TFLOP/s} and 'memory_gbps'."""
        out = {f.name.removesuffix("_tflops"): getattr(self, f.name) for f in fields(self)
               if f.name.endswith("_tflops") and getattr(self, f.name) is not None}
        if self.memory_gbps is not None:
            out["memory_gbps"] = self.memory_gbps
        return out


@dataclass(frozen=True)
class Scenario:
    """What a replay changes. Scenario() (= Scenario.identity()) changes nothing."""
    name: str = key("identity", text)  # a file's default is its stem (the loader)
    description: str = key("", text)
    seed: int = key(0, int_at_least(0))
    steps: int | None = key(None, int_at_least(1))  # target steps for [failures]
    network: NetworkSpec = key(check=schema(NetworkSpec), make=NetworkSpec)
    compute: ComputeSpec = key(check=schema(ComputeSpec), make=ComputeSpec)
    optical: OpticalSpec | None = key(None, schema(OpticalSpec))
    failures: FailuresSpec | None = key(None, schema(FailuresSpec))
    parallelism: ParallelismSpec = key(check=schema(ParallelismSpec), make=ParallelismSpec)
    topology: TopologySpec = key(check=schema(TopologySpec), make=TopologySpec)
    hardware: HardwareSpec = key(check=schema(HardwareSpec), make=HardwareSpec)
    memory: MemorySpec = key(check=schema(MemorySpec), make=MemorySpec)
    batch: BatchSpec = key(check=schema(BatchSpec), make=BatchSpec)
    source: str | None = None  # the file read, for messages

    @classmethod
    def identity(cls) -> "Scenario":
        """No change: measured transfers and durations are replayed as they were."""
        return cls()

    @property
    def needs_calibration(self) -> bool:
        """Whether comm_model needs a calibrated base (something re-costs transfers)."""
        return ((self.network.changes_network and self.network.calibrate != "none")
                or (self.optical is not None and self.optical.own_circuits))

    def calibrate(self, colls, nccl_tests=None) -> CalibratedModel | None:
        """The base model per [network] calibrate: 'run' (default) fits the run's collectives,
        'nccl_tests' the store's nccl_tests rows (given as nccl_tests), 'none' gives None."""
        return factory.calibrate(self.network, colls, nccl_tests, where=self.where)

    def comm_model(self, calibrated_base=None, *, nccl_tests=None, with_optical: bool = True):
        """The communication model of this scenario.

        calibrated_base: a CalibratedModel, or the collectives frame itself (then calibrated here per
        [network] calibrate, nccl_tests giving the store's nccl_tests rows when that says so), or None
        (enough when the network is unchanged or calibrate = 'none'). With [optical] present and
        with_optical, the result is wrapped in the optical circuit switch model."""
        return factory.comm_model(self, calibrated_base, nccl_tests=nccl_tests, with_optical=with_optical)

    def compute_model(self):
        return factory.compute_model(self.compute)

    @property
    def where(self) -> str:
        """The scenario as messages name it: its file, else its name."""
        return self.source or self.name


SCHEMA = schema(Scenario)
