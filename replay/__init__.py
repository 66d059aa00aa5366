"""Replay: the discrete-event core (engine) over a run's dependency graph (built by analyses.depgraph), the
what-if models (network, optical, compute, failures, scenario files) and the re-timed run written back as a store.

    import replay
    result = replay.run("runs/job42/")            # baseline: reproduces the measured steps
    result.summary()                               # per rank: measured vs predicted step time
    result.write_store("runs/job42-replayed/")     # same schema: every analysis works on it
"""
from __future__ import annotations


def run(store, scenario=None, *, ranks=None, compiled: bool | None = None, fold="auto", fold_tolerance: float = 0.05):
    """Replay a trace directory, store directory or tracekit Run, optionally under a scenario (a
    Scenario or a scenario file). fold: fold ranks identical up to fold_tolerance (True, False, or
    "auto": above 64 ranks). Returns a `replay.replayer.ReplayResult`."""
    from .replayer import replay

    return replay(store, scenario, ranks=ranks, compiled=compiled, fold=fold, fold_tolerance=fold_tolerance)


__all__ = ["run"]
