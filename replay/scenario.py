"""Scenario files: what a replay should change, read from TOML (or YAML when PyYAML is installed),
validated key by key, and turned into the models the engine plugs in.

    [network]
    bandwidth_scale = 4.0          # every link 4x faster

is a complete scenario. Every section and key (types, ranges, defaults) is in SCHEMA below and in
docs/whatif_models.md. A bad file raises ScenarioError with one line naming the file, the key as
`[section] key` and what is allowed.

    sc = load_scenario("faster_net.toml")
    base = sc.calibrate(colls)                 # per [network] calibrate: the run, nccl-tests, or none
    comm = sc.comm_model(base)                 # a CommModel (inside the OCS model when [optical] is given)
    compute = sc.compute_model()
    sc.failures.goodput(step_ns)               # when [failures] is given
"""
from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field

import pandas as pd

from tracekit.errors import TracekitError

from .compute import KERNEL_CLASSES, ComputeModel, Speedup
from .failures import DEFAULT_MTBF_GPU_HOURS, STRATEGIES, GoodputResult, Strategy, goodput, make_strategy
from .network import (DEFAULT_LINKS, LINK_CLASSES, AlphaBetaModel, CalibratedModel, Link, LinkOverride, MeasuredComm,
                      WhatIfComm, calibrate, calibrate_nccl_tests)
from .optical import OpticalModel, Phase


class ScenarioError(TracekitError):
    """A scenario file that cannot be used. The message is one line naming the file and the key."""


# ---------------------------------------------------------------------------------------------------
# Value checks: each returns the value (normalised) or raises _Bad with what is allowed.


class _Bad(Exception):
    pass


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive(v):
    if not _is_num(v) or not math.isfinite(v) or v <= 0:
        raise _Bad("must be a number > 0")
    return float(v)


def non_negative(v):
    if not _is_num(v) or not math.isfinite(v) or v < 0:
        raise _Bad("must be a number >= 0")
    return float(v)


def fraction(v):
    if not _is_num(v) or not (0 <= v <= 1):
        raise _Bad("must be a number in [0, 1]")
    return float(v)


def int_at_least(lo):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise _Bad(f"must be an integer >= {lo}")
        return v
    return check


def one_of(*allowed):
    def check(v):
        if v not in allowed or not isinstance(v, str):
            raise _Bad(f"must be one of: {', '.join(allowed)}")
        return v
    return check


def text(v):
    if not isinstance(v, str):
        raise _Bad("must be a string")
    return v


def regex(v):
    if not isinstance(v, str):
        raise _Bad("must be a string (a regular expression)")
    try:
        re.compile(v)
    except re.error as e:
        raise _Bad(f"is not a valid regular expression ({e})") from None
    return v


def globs(v):
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return list(v)
    raise _Bad("must be a glob or a non-empty list of globs")


def ordinals(v):
    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or v[0] < 0 or v[0] > v[1]):
        raise _Bad("must be [start, stop) with 0 <= start <= stop, integers")
    return v


def interval(v):
    if v == "optimal":
        return None
    if not _is_num(v) or not math.isfinite(v) or v <= 0:
        raise _Bad('must be a number of seconds > 0 or "optimal"')
    return float(v)


# section -> key -> check; a dict value is a sub-table, a ("array", {...}) an array of tables,
# ("map", key_check, value_check) a table of free keys.
LINK_KEYS = {"bandwidth_gbps": positive, "latency_us": non_negative}
STRATEGY_KEYS = {
    "checkpoint_restart": ("checkpoint_interval_s", "checkpoint_cost_s", "restart_cost_s"),
    "in_memory": ("checkpoint_interval_s", "checkpoint_cost_s", "restart_cost_s"),
    "live_migration": ("failover_cost_s", "repair_time_s", "replicas", "rollback_fraction", "checkpoint_interval_s",
                       "checkpoint_cost_s", "restart_cost_s"),
    "redundant": ("redundancy_overhead", "failover_cost_s", "repair_time_s", "partner_gpus", "checkpoint_interval_s",
                  "checkpoint_cost_s", "restart_cost_s"),
}


def _rank_key(k):
    try:
        r = int(k)
    except (TypeError, ValueError):
        raise _Bad("rank must be an integer >= 0") from None
    if isinstance(k, bool) or r < 0 or (isinstance(k, str) and k.strip() != str(r)):
        raise _Bad("rank must be an integer >= 0")
    return r


SCHEMA = {
    "name": text,
    "description": text,
    "seed": int_at_least(0),
    "steps": int_at_least(1),
    "network": {
        "bandwidth_scale": positive,
        "latency_scale": positive,
        "algorithm": one_of("ring", "tree", "hierarchical", "auto", "measured"),
        "calibrate": one_of("run", "nccl_tests", "none"),
        "calibrate_algorithm": one_of("ring", "tree"),
        "gpus_per_node": int_at_least(1),
        "nccl_tests_group_size": int_at_least(1),
        "nccl_tests_hosts": int_at_least(1),
        "links": {c: dict(LINK_KEYS) for c in LINK_CLASSES},
    },
    "compute": {
        "cpu_scale": positive,
        "speedup": ("array", {"kernel_class": one_of(*KERNEL_CLASSES), "name": regex, "factor": positive}),
        "rank_slowdown": ("map", _rank_key, positive),
    },
    "optical": {
        "reconfig_delay_ms": non_negative,
        "schedule": one_of("job", "phase"),
        "circuit_bandwidth_gbps": positive,
        "circuit_latency_us": non_negative,
        "circuits": globs,
        "phase": ("array", {"match": globs, "circuits": globs, "ordinals": ordinals, "name": text}),
    },
    "failures": {
        "mtbf_gpu_hours": positive,
        "n_gpus": int_at_least(1),
        "strategy": one_of(*STRATEGIES),
        "checkpoint_interval_s": interval,
        "checkpoint_cost_s": non_negative,
        "restart_cost_s": non_negative,
        "failover_cost_s": non_negative,
        "repair_time_s": non_negative,
        "replicas": int_at_least(1),
        "redundancy_overhead": non_negative,
        "partner_gpus": int_at_least(1),
        "rollback_fraction": fraction,
        "target_steps": int_at_least(1),
        "trials": int_at_least(2),
    },
    "parallelism": {"dp": int_at_least(1), "tp": int_at_least(1), "pp": int_at_least(1), "micro_batches": int_at_least(1)},
}


def _where(path: tuple) -> str:
    """`[network.links] inter_node`-style location of a key."""
    *table, key = path
    if not table:
        return str(key)
    table = [str(t) for t in table]
    if " #" in table[-1]:  # an element of an array of tables
        name, idx = table[-1].split(" #")
        return f"[[{'.'.join(table[:-1] + [name])}]] #{idx} {key}"
    return f"[{'.'.join(table)}] {key}"


def _validate(doc, schema: dict, path: tuple, fail) -> dict:
    if not isinstance(doc, dict):
        fail(path, "must be a table")
    out = {}
    for key, value in doc.items():
        if key not in schema:
            fail(path + (key,), f"unknown key; allowed: {', '.join(schema)}")
        rule = schema[key]
        here = path + (key,)
        if isinstance(rule, dict):
            out[key] = _validate(value, rule, here, fail)
        elif isinstance(rule, tuple) and rule[0] == "array":
            if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
                fail(here, "must be an array of tables ([[...]])")
            items = []
            for i, item in enumerate(value, 1):
                items.append(_validate(item, rule[1], path + (f"{key} #{i}",), fail))
            out[key] = items
        elif isinstance(rule, tuple) and rule[0] == "map":
            if not isinstance(value, dict):
                fail(here, "must be a table")
            m = {}
            for k, v in value.items():
                try:
                    kk = rule[1](k)
                except _Bad as e:
                    fail(here + (k,), str(e))
                try:
                    m[kk] = rule[2](v)
                except _Bad as e:
                    fail(here + (k,), str(e))
            out[key] = m
        else:
            try:
                out[key] = rule(value)
            except _Bad as e:
                fail(here, str(e))
    return out


# ---------------------------------------------------------------------------------------------------
# The scenario


@dataclass(frozen=True)
class OpticalSpec:
    reconfig_delay_ms: float = 1.2
    schedule: str = "job"
    circuit_bandwidth_gbps: float | None = None
    circuit_latency_us: float | None = None
    circuits: tuple = ("*",)
    phases: tuple = ()
    gpus_per_node: int | None = None

    def model(self, inner) -> OpticalModel:
        return OpticalModel(inner, reconfig_delay_ms=self.reconfig_delay_ms, schedule=self.schedule,
                            phases=[dict(p) for p in self.phases], circuit_bandwidth_gbps=self.circuit_bandwidth_gbps,
                            circuit_latency_us=self.circuit_latency_us, circuits=tuple(self.circuits),
                            gpus_per_node=self.gpus_per_node)


@dataclass(frozen=True)
class FailuresSpec:
    strategy: Strategy
    n_gpus: int | None = None
    mtbf_gpu_hours: float = DEFAULT_MTBF_GPU_HOURS
    target_steps: int | None = None
    trials: int = 400
    seed: int = 0

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


@dataclass(frozen=True)
class Scenario:
    name: str = "identity"
    description: str = ""
    seed: int = 0
    steps: int | None = None
    network: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    optical: OpticalSpec | None = None
    failures: FailuresSpec | None = None
    parallelism: dict | None = None
    source: str | None = None

    @classmethod
    def identity(cls) -> "Scenario":
        """No change: measured transfers and durations are replayed as they were."""
        return cls()

    # -- network ------------------------------------------------------------------------------------
    @property
    def changes_network(self) -> bool:
        n = self.network
        return (n.get("bandwidth_scale", 1.0) != 1.0 or n.get("latency_scale", 1.0) != 1.0
                or bool({k: v for k, v in n.get("links", {}).items() if k != "optical"})
                or n.get("algorithm") not in (None, "measured"))

    @property
    def _own_circuits(self) -> bool:
        o = self.optical
        return o is not None and (o.circuit_bandwidth_gbps is not None or o.circuit_latency_us is not None)

    @property
    def needs_calibration(self) -> bool:
        """Whether comm_model needs a calibrated base (something re-costs transfers)."""
        return ((self.changes_network and self.network.get("calibrate", "run") != "none") or self._own_circuits)

    def calibrate(self, colls, nccl_tests=None) -> CalibratedModel | None:
        """The base model per [network] calibrate: 'run' (default) fits the run's collectives,
        'nccl_tests' the store's nccl_tests rows (given as nccl_tests), 'none' gives None."""
        how = self.network.get("calibrate", "run")
        alg = self.network.get("calibrate_algorithm", "ring")
        gpn = self.network.get("gpus_per_node")
        if how == "none":
            return None
        if how == "run":
            return calibrate(colls, algorithm=alg, gpus_per_node=gpn)
        if nccl_tests is None or len(nccl_tests) == 0:
            raise ScenarioError(f"{self._src}: [network] calibrate: 'nccl_tests' but the store has no nccl-tests rows "
                                "(ingest with --nccl-tests FILE)")
        size = self.network.get("nccl_tests_group_size")
        if size is None:
            raise ScenarioError(f"{self._src}: [network] nccl_tests_group_size: required with calibrate = 'nccl_tests' "
                                "(nccl-tests does not record its rank count)")
        return calibrate_nccl_tests(nccl_tests, group_size=size, n_hosts=self.network.get("nccl_tests_hosts", 1),
                                    algorithm=alg, gpus_per_node=gpn)

    def comm_model(self, calibrated_base=None, *, nccl_tests=None, with_optical: bool = True):
        """The communication model of this scenario.

        calibrated_base: a CalibratedModel, or the collectives frame itself (then calibrated here per
        [network] calibrate, nccl_tests giving the store's nccl_tests rows when that says so), or None
        (enough when the network is unchanged or calibrate = 'none'). With [optical] present and
        with_optical, the result is wrapped in the optical circuit switch model."""
        model = self._network_model(calibrated_base, nccl_tests)
        if with_optical and self.optical is not None:
            return self.optical.model(model)
        return model

    def _network_model(self, base, nccl_tests):
        n = self.network
        if isinstance(base, pd.DataFrame):
            base = self.calibrate(base, nccl_tests) if self.needs_calibration else None
        if n.get("algorithm") == "measured" or not self.changes_network:
            if self._own_circuits:
                if n.get("calibrate", "run") == "none":  # absolute costs from the default links
                    return AlphaBetaModel(gpus_per_node=n.get("gpus_per_node"))
                if base is None:
                    raise ScenarioError(f"{self._src}: [optical] circuits with their own bandwidth or latency need a "
                                        "calibrated model: pass the collectives or scenario.calibrate(colls)")
                return WhatIfComm(base)  # measured times, re-costable on circuits
            return MeasuredComm()
        links = {c: LinkOverride(**v) for c, v in n.get("links", {}).items() if c != "optical"}
        alg = n.get("algorithm")
        bw, lat = n.get("bandwidth_scale", 1.0), n.get("latency_scale", 1.0)
        if n.get("calibrate", "run") == "none":
            # no calibration: absolute costs from the default links, scaled, with the given ones as written
            full = {}
            for c in LINK_CLASSES:
                d = DEFAULT_LINKS[c]
                scaled = Link(bandwidth_gbps=d.bandwidth_gbps * bw, latency_us=d.latency_us * lat)
                full[c] = links[c].over(scaled) if c in links else scaled
            return AlphaBetaModel(links=full, algorithm=alg or "ring", gpus_per_node=n.get("gpus_per_node"))
        if base is None:
            raise ScenarioError(f"{self._src}: [network] changes the network but no calibrated model was given: "
                                "pass the collectives or scenario.calibrate(colls) to comm_model")
        return WhatIfComm(base, bandwidth_scale=bw, latency_scale=lat, links=links, algorithm=alg)

    def compute_model(self) -> ComputeModel:
        c = self.compute
        return ComputeModel(speedups=[Speedup(factor=s["factor"], kernel_class=s.get("kernel_class"),
                                              name=s.get("name")) for s in c.get("speedup", [])],
                            rank_slowdown=dict(c.get("rank_slowdown", {})), cpu_scale=c.get("cpu_scale", 1.0))

    @property
    def _src(self) -> str:
        return self.source or self.name


# ---------------------------------------------------------------------------------------------------
# Loading


def _read(path: str) -> dict:
    ext = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read the file ({e.strerror})") from None
    if ext == ".toml":
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ScenarioError(f"{path}: not valid TOML ({_one_line(e)})") from None
    if ext in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ScenarioError(f"{path}: YAML scenarios need PyYAML: pip install pyyaml, or write the scenario "
                                "in TOML") from None
        try:
            doc = yaml.safe_load(raw.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ScenarioError(f"{path}: not valid YAML ({_one_line(e)})") from None
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            raise ScenarioError(f"{path}: the top level must be a mapping of sections")
        return doc
    raise ScenarioError(f"{path}: unknown scenario format {ext or '(no extension)'}; allowed: .toml, .yaml, .yml")


def _one_line(e) -> str:
    return " ".join(str(e).split())


def load_scenario(path: str | os.PathLike) -> Scenario:
    path = os.fspath(path)
    return scenario_from_dict(_read(path), source=path)


def scenario_from_dict(doc: dict, source: str = "<scenario>") -> Scenario:
    """Validate a parsed scenario document (as TOML or YAML gives it) and build the Scenario."""
    def fail(where: tuple, what: str):
        raise ScenarioError(f"{source}: {_where(where)}: {what}" if where else f"{source}: {what}")

    d = _validate(doc, SCHEMA, (), fail)
    net = d.get("network", {})
    if net.get("algorithm") == "measured":
        extra = [k for k in ("bandwidth_scale", "latency_scale", "links") if k in net]
        if extra:
            fail(("network", "algorithm"), f"'measured' keeps the measured transfers; it cannot be combined with {', '.join(extra)}")
    if net.get("calibrate") == "nccl_tests" and "nccl_tests_group_size" not in net:
        fail(("network", "nccl_tests_group_size"), "required with calibrate = 'nccl_tests' (nccl-tests does not "
             "record its rank count)")
    comp = d.get("compute", {})
    for i, s in enumerate(comp.get("speedup", []), 1):
        if "factor" not in s:
            fail(("compute", f"speedup #{i}", "factor"), "missing; every speedup needs factor (a number > 0)")
        if "kernel_class" not in s and "name" not in s:
            fail(("compute", f"speedup #{i}", "kernel_class"), "missing; a speedup needs kernel_class or name")

    optical = None
    if "optical" in d:
        o = d["optical"]
        phases = o.get("phase", [])
        for i, p in enumerate(phases, 1):
            if "match" not in p:
                fail(("optical", f"phase #{i}", "match"), "missing; a phase needs match (op or pg_name globs)")
        schedule = o.get("schedule", "phase" if phases else "job")
        if schedule == "phase" and not phases:
            fail(("optical", "schedule"), "'phase' needs at least one [[optical.phase]]")
        link = net.get("links", {}).get("optical", {})
        optical = OpticalSpec(
            reconfig_delay_ms=o.get("reconfig_delay_ms", 1.2), schedule=schedule,
            circuit_bandwidth_gbps=o.get("circuit_bandwidth_gbps", link.get("bandwidth_gbps")),
            circuit_latency_us=o.get("circuit_latency_us", link.get("latency_us")),
            circuits=tuple(o.get("circuits", ["*"])),
            phases=tuple(tuple(sorted(p.items())) for p in phases), gpus_per_node=net.get("gpus_per_node"))
        for p in optical.phases:
            Phase.from_dict(dict(p))  # already validated; builds the same way the model will

    failures = None
    if "failures" in d:
        f = d["failures"]
        kind = f.get("strategy", "checkpoint_restart")
        applies = STRATEGY_KEYS[kind]
        params = {}
        for key in ("checkpoint_interval_s", "checkpoint_cost_s", "restart_cost_s", "failover_cost_s", "repair_time_s",
                    "replicas", "redundancy_overhead", "partner_gpus", "rollback_fraction"):
            if key in f:
                if key not in applies:
                    fail(("failures", key), f"does not apply to strategy {kind}; its keys: {', '.join(applies)}")
                params[key] = f[key]
        try:
            strategy = make_strategy(kind, **params)
        except ValueError as e:
            fail(("failures", "strategy"), _one_line(e))
        failures = FailuresSpec(strategy=strategy, n_gpus=f.get("n_gpus"),
                                mtbf_gpu_hours=f.get("mtbf_gpu_hours", DEFAULT_MTBF_GPU_HOURS),
                                target_steps=f.get("target_steps", d.get("steps")), trials=f.get("trials", 400),
                                seed=d.get("seed", 0))

    name = d.get("name")
    if name is None:
        name = os.path.splitext(os.path.basename(source))[0] if source and not source.startswith("<") else "scenario"
    return Scenario(name=name, description=d.get("description", ""), seed=d.get("seed", 0), steps=d.get("steps"),
                    network=net, compute=comp, optical=optical, failures=failures,
                    parallelism=d.get("parallelism"), source=source)
