"""Which rank runs on which host, when a scenario says so: `[topology]` in place of the run's hosts.

The run's own hosts come with the graph (each collective's `n_hosts`, from run.json's hosts, else the
traces' host names: analyses/depgraph). A scenario's `[topology]` (`ranks_per_host = N`, or
`hosts = [[0, 1], [2, 3]]`) overrides them: every collective's host count is recounted from its group's
ranks, before any model that tells intra- from inter-node links (network, optical, parallelism) reads it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .checks import ScenarioError
from .specs import TopologySpec


def host_of(spec: TopologySpec, ranks, where: str) -> dict[int, int]:
    """rank -> host index under the spec, for every rank in `ranks` (the run's); a rank the spec puts
    on no host is one error naming the key."""
    ranks = sorted({int(r) for r in ranks})
    if spec.ranks_per_host is not None:
        return {r: r // spec.ranks_per_host for r in ranks}
    out = {int(r): h for h, group in enumerate(spec.hosts) for r in group}
    missing = [r for r in ranks if r not in out]
    if missing:
        raise ScenarioError(f"{where}: [topology] hosts: rank {missing[0]} of the run is on no host "
                            f"({len(missing)} rank(s) left out); list every rank once")
    return out


def apply(colls: pd.DataFrame, spec: TopologySpec, store_ranks, where: str) -> tuple[pd.DataFrame, list[str]]:
    """The collectives with n_hosts recounted under the scenario's topology, and the note saying so."""
    group_ranks = {int(r) for grp in colls["ranks"] for r in grp}
    hosts = host_of(spec, group_ranks | {int(r) for r in store_ranks}, where)
    out = colls.copy()
    out["n_hosts"] = pd.array([len({hosts[int(r)] for r in grp}) for grp in colls["ranks"]], dtype="Int64")
    n_hosts = len(set(hosts.values()))
    how = (f"ranks_per_host = {spec.ranks_per_host}" if spec.ranks_per_host is not None
           else f"hosts = {[list(g) for g in spec.hosts]}")
    spanning = int((out["n_hosts"].to_numpy(dtype="float64", na_value=np.nan) > 1).sum())
    return out, [f"topology from {where} [topology] {how}: {n_hosts} host(s); {spanning} of {len(out)} "
                 "collective(s) span hosts"]
