"""Scenario files: what a replay should change, read from TOML (or YAML when PyYAML is installed),
validated key by key and turned into a typed Scenario.

    [network]
    bandwidth_scale = 4.0          # every link 4x faster

is a complete scenario. Every section and key (types, ranges, defaults) is a field of the specs in
replay/specs.py and a row of docs/whatif_models.md. A bad file raises ScenarioError with one line
naming the file, the key as `[section] key` and what is allowed (the checks: replay/checks.py).

    sc = load_scenario("faster_net.toml")
    base = sc.calibrate(colls)                 # per [network] calibrate: the run, nccl-tests, or none
    comm = sc.comm_model(base)                 # a CommModel (inside the OCS model when [optical] is given)
    compute = sc.compute_model()
    sc.failures.goodput(step_ns)               # when [failures] is given

This module owns reading a file and the rules between keys (which keys go together); the models are
built by replay/factory.py.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import replace

from .checks import ScenarioError, failer, validate
from .compute import Speedup
from .failures import DEFAULT_STRATEGY, make_strategy, strategy_parameters
from .costs import LinkOverride
from .optical import Phase
from .specs import (SCHEMA, STRATEGY_PARAMETERS, BatchSpec, ComputeSpec, FailuresSpec, HardwareSpec, HostOverride,
                    MemorySpec, NetworkSpec, OpticalSpec, ParallelismSpec, Scenario, TopologySpec)

__all__ = ["Scenario", "ScenarioError", "load_scenario", "scenario_from_dict"]


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
    fail = failer(source)
    d = validate(doc, SCHEMA, (), fail)
    net = _network(d.get("network", {}), fail)
    compute = _compute(d.get("compute", {}), fail)
    optical = _optical(d["optical"], d.get("network", {}), fail) if "optical" in d else None
    top = {k: d[k] for k in ("name", "description", "seed", "steps") if k in d}
    if "name" not in top:
        top["name"] = os.path.splitext(os.path.basename(source))[0] if source and not source.startswith("<") else "scenario"
    sc = Scenario(**top, network=net, compute=compute, optical=optical,
                  parallelism=ParallelismSpec(**d.get("parallelism", {})),
                  topology=_topology(d.get("topology", {}), fail), hardware=_hardware(d.get("hardware", {}), source),
                  memory=MemorySpec(**d.get("memory", {})), batch=BatchSpec(**d.get("batch", {})), source=source)
    return replace(sc, failures=_failures(d["failures"], sc, fail)) if "failures" in d else sc


def _network(n: dict, fail) -> NetworkSpec:
    if n.get("algorithm") == "measured":
        extra = [k for k in ("bandwidth_scale", "latency_scale", "links") if k in n]
        if extra:
            fail(("network", "algorithm"), f"'measured' keeps the measured transfers; it cannot be combined with {', '.join(extra)}")
    if n.get("calibrate") == "nccl_tests" and "nccl_tests_group_size" not in n:
        fail(("network", "nccl_tests_group_size"), "required with calibrate = 'nccl_tests' (nccl-tests does not "
             "record its rank count)")
    links = {c: LinkOverride(**v) for c, v in n.get("links", {}).items()}
    hosts = n.get("hosts", [])
    for i, h in enumerate(hosts, 1):
        if "ranks" not in h:
            fail(("network", f"hosts #{i}", "ranks"), "missing; a host is named by the ranks it holds, e.g. ranks = [1]")
    if hosts and n.get("model", "links") != "links":
        fail(("network", "hosts #1", "ranks"), "per-host links need the shared-link model: [network] model = 'links' "
             "(the default)")
    return NetworkSpec(**{**n, "links": links, "hosts": tuple(HostOverride(**h) for h in hosts)})


def _topology(t: dict, fail) -> TopologySpec:
    if "ranks_per_host" in t and "hosts" in t:
        fail(("topology", "hosts"), "give ranks_per_host or hosts, not both")
    return TopologySpec(**t)


def _hardware(h: dict, source: str) -> HardwareSpec:
    from . import hardware  # reads the device catalog: only for a scenario that has [hardware]

    if "catalog" in h:
        h = {**h, "catalog": hardware.catalog_path(h["catalog"], source)}
    spec = HardwareSpec(**h)
    if h:
        hardware.check(spec, source)
    return spec


def _compute(c: dict, fail) -> ComputeSpec:
    for i, s in enumerate(c.get("speedup", []), 1):
        if "factor" not in s:
            fail(("compute", f"speedup #{i}", "factor"), "missing; every speedup needs factor (a number > 0)")
        if "kernel_class" not in s and "name" not in s:
            fail(("compute", f"speedup #{i}", "kernel_class"), "missing; a speedup needs kernel_class or name")
    return ComputeSpec(**{**c, "speedup": tuple(Speedup(**s) for s in c.get("speedup", []))})


def _optical(o: dict, net: dict, fail) -> OpticalSpec:
    phases = o.get("phase", [])
    for i, p in enumerate(phases, 1):
        if "match" not in p:
            fail(("optical", f"phase #{i}", "match"), "missing; a phase needs match (op or pg_name globs)")
    if o.get("schedule") == "phase" and not phases:
        fail(("optical", "schedule"), "'phase' needs at least one [[optical.phase]]")
    given = {k: v for k, v in o.items() if k != "phase"}
    if phases:  # phases given: one assignment per phase unless the file says job
        given.setdefault("schedule", "phase")
    if "circuits" in given:
        given["circuits"] = tuple(given["circuits"])
    # the circuits' bandwidth and latency default to [network.links.optical]'s
    link = net.get("links", {}).get("optical", {})
    for own, from_link in (("circuit_bandwidth_gbps", "bandwidth_gbps"), ("circuit_latency_us", "latency_us")):
        if own not in given and from_link in link:
            given[own] = link[from_link]
    return OpticalSpec(**given, phases=tuple(Phase.from_dict(p) for p in phases), gpus_per_node=net.get("gpus_per_node"))


def _failures(f: dict, sc: Scenario, fail) -> FailuresSpec:
    kind = f.get("strategy", DEFAULT_STRATEGY)
    applies = strategy_parameters(kind)
    params = {}
    for k in STRATEGY_PARAMETERS:
        if k in f:
            if k not in applies:
                fail(("failures", k), f"does not apply to strategy {kind}; its keys: {', '.join(applies)}")
            params[k] = f[k]
    try:
        strategy = make_strategy(kind, **params)
    except ValueError as e:
        fail(("failures", "strategy"), _one_line(e))
    own = {k: v for k, v in f.items() if k not in STRATEGY_PARAMETERS and k != "strategy"}
    own.setdefault("target_steps", sc.steps)
    return FailuresSpec(**own, strategy=strategy, seed=sc.seed)
