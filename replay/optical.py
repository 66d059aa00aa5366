"""Optical circuit switching (domain.md section 7) as a wrapper around a communication model.

An optical circuit switch (OCS) gives each node a few direct circuits to chosen peers instead of a
packet-switched fabric. The model here:

- A circuit assignment says which process groups' inter-node traffic rides direct circuits: a list of
  pg_name globs (['*']: every multi-host group). A collective on a circuit is costed by the inner model
  with the inter-node link replaced by the circuit: no switch hops (latency circuit_latency_us) and the
  circuit's own bandwidth (circuit_bandwidth_gbps); a parameter left None keeps the inner model's
  inter-node value, so circuits with both None are today's network again. Intra-node collectives
  (NVLink) and collectives whose group is not in the assignment keep the inner model's time.
- schedule 'job': one assignment for the whole run (TopoOpt: the topology is chosen with the job's
  parallelisation), configured before the job starts: no reconfiguration. With phases given, the job's
  assignment is the union of their circuits, else `circuits`.
- schedule 'phase': phases are sets of collectives, each needing its own assignment. A phase matches a
  collective by `match` (globs tried against op and against pg_name) and optionally `ordinals`
  [start, stop) over the collective's arrival `order`; the first matching phase wins. Walking the
  collectives in arrival order, each time a collective needs an assignment other than the one in place
  the switch reconfigures: reconfig_delay_ms during which the affected links carry nothing, so that
  collective's transfer is delayed by it. The first assignment is set up before the job (not counted).
  Collectives no phase matches, and intra-node ones, need nothing and keep the current assignment.

reconfig_delay_ms default 1.2: MEMS OCS median reconfiguration (TPU v4; p99 < 3 ms); a patch panel
takes minutes. transfer_ns() includes the delays; after a call, `reconfigurations` (count),
`reconfig_ns` (per row) and `on_circuit` (per row) describe what happened. Port contention (a node
with fewer optical ports than circuits wanted at once) is not modelled.
"""
from __future__ import annotations

import fnmatch
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .costs import LinkOverride, coll_rows, is_inter

SCHEDULES = ("job", "phase")
DEFAULT_RECONFIG_DELAY_MS = 1.2  # MEMS OCS median reconfiguration (TPU v4)
EVERY_GROUP = ("*",)  # circuit globs: every multi-host group


def _globs(v, what: str) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise ValueError(f"{what} must be a glob or a non-empty list of globs, got {v!r}")


@dataclass(frozen=True)
class Phase:
    match: tuple[str, ...]
    circuits: tuple[str, ...] = EVERY_GROUP
    ordinals: tuple[int, int] | None = None
    name: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Phase":
        unknown = set(d) - {"match", "circuits", "ordinals", "name"}
        if unknown:
            raise ValueError(f"unknown phase key(s) {', '.join(sorted(unknown))}; allowed: match, circuits, ordinals, name")
        if "match" not in d:
            raise ValueError("a phase needs match (a glob over op or pg_name)")
        ords = d.get("ordinals")
        if ords is not None:
            if (not isinstance(ords, (list, tuple)) or len(ords) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in ords) or ords[0] > ords[1]):
                raise ValueError(f"ordinals must be [start, stop) with start <= stop, got {ords!r}")
            ords = (int(ords[0]), int(ords[1]))
        name = d.get("name")
        if name is not None and not isinstance(name, str):
            raise ValueError("phase name must be a string")
        return cls(match=_globs(d["match"], "match"), circuits=_globs(d.get("circuits", EVERY_GROUP), "circuits"),
                   ordinals=ords, name=name)

    @property
    def assignment(self) -> str:
        """Identity of the circuit assignment: two phases with the same one need no reconfiguration."""
        return self.name if self.name is not None else "circuits:" + ",".join(self.circuits)

    def matches(self, op: str, pg, order: int) -> bool:
        if self.ordinals is not None and not (self.ordinals[0] <= order < self.ordinals[1]):
            return False
        pg_s = "" if pg is None else str(pg)
        return any(fnmatch.fnmatchcase(op, g) or (pg is not None and fnmatch.fnmatchcase(pg_s, g)) for g in self.match)


@dataclass
class OpticalPlan:
    """Per row: the assignment in place, whether the collective rides a circuit, the delay before it."""
    assignment: np.ndarray     # object: assignment identity in place when the collective runs (None: none)
    on_circuit: np.ndarray     # bool
    reconfig_ns: np.ndarray    # int64
    reconfigurations: int


@dataclass
class OpticalModel:
    inner: object
    reconfig_delay_ms: float = DEFAULT_RECONFIG_DELAY_MS
    schedule: str = "job"
    phases: list = field(default_factory=list)      # Phase or dicts {match, circuits, ordinals, name}
    circuit_bandwidth_gbps: float | None = None
    circuit_latency_us: float | None = None
    circuits: tuple[str, ...] = EVERY_GROUP          # the job schedule's assignment when no phases
    gpus_per_node: int | None = None                 # tells multi-host groups apart when n_hosts is NULL

    reconfigurations: int = field(default=0, init=False)
    reconfig_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False)
    on_circuit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), init=False)

    def __post_init__(self):
        d = self.reconfig_delay_ms
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not math.isfinite(d) or d < 0:
            raise ValueError(f"reconfig_delay_ms must be a number >= 0, got {d!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; allowed: job, phase")
        self.phases = [p if isinstance(p, Phase) else Phase.from_dict(p) for p in (self.phases or [])]
        self.circuits = _globs(self.circuits, "circuits")
        if self.schedule == "phase" and not self.phases:
            raise ValueError("schedule 'phase' needs at least one phase")
        self._override = None
        if self.circuit_bandwidth_gbps is not None or self.circuit_latency_us is not None:
            self._override = LinkOverride(bandwidth_gbps=self.circuit_bandwidth_gbps, latency_us=self.circuit_latency_us)

    @property
    def delay_ns(self) -> int:
        return int(round(self.reconfig_delay_ms * 1e6))

    @property
    def notes(self) -> list[str]:
        # what the switch did is in reconfigurations / reconfig_ns / on_circuit; the inner model's
        # calibration notes are not repeated here
        return []

    def plan(self, colls: pd.DataFrame) -> OpticalPlan:
        r = coll_rows(colls)
        k = len(r)
        inter = is_inter(r, self.gpus_per_node)
        assignment = np.full(k, None, dtype=object)
        reconf = np.zeros(k, dtype=np.int64)
        circuits_of: dict[str, tuple[str, ...]] = {}
        count = 0
        if self.schedule == "job":
            globs = tuple(dict.fromkeys(g for p in self.phases for g in p.circuits)) if self.phases else self.circuits
            circuits_of["job"] = globs
            assignment[:] = "job"
        else:
            for p in self.phases:
                circuits_of.setdefault(p.assignment, p.circuits)
            ids = colls["coll_id"].to_numpy(dtype="int64") if "coll_id" in colls.columns else np.arange(k)
            seq = np.lexsort((ids, r.order))
            current = None
            for i in seq:
                need = None
                if inter[i]:
                    need = next((p.assignment for p in self.phases if p.matches(r.op[i], r.pg[i], int(r.order[i]))), None)
                if need is not None and need != current:
                    if current is not None:  # the first assignment is set up before the job starts
                        reconf[i] = self.delay_ns
                        count += 1
                    current = need
                assignment[i] = current
        on = np.zeros(k, dtype=bool)
        for i in np.flatnonzero(inter):
            a = assignment[i]
            if a is None:
                continue
            pg = "" if r.pg[i] is None else str(r.pg[i])
            on[i] = any(fnmatch.fnmatchcase(pg, g) for g in circuits_of[a])
        return OpticalPlan(assignment=assignment, on_circuit=on, reconfig_ns=reconf, reconfigurations=count)

    def transfer_ns(self, colls: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        plan = self.plan(colls)
        out = np.asarray(self.inner.transfer_ns(colls, rng), dtype=np.int64).copy()
        if self._override is not None and plan.on_circuit.any():
            circuit = self.inner.with_links({"inter_node": self._override})
            sub = colls.iloc[np.flatnonzero(plan.on_circuit)]
            out[plan.on_circuit] = np.asarray(circuit.transfer_ns(sub, rng), dtype=np.int64)
        self.reconfigurations = plan.reconfigurations
        self.reconfig_ns = plan.reconfig_ns
        self.on_circuit = plan.on_circuit
        return out + plan.reconfig_ns
