"""tracekit: trace-driven profiler and replay analyzer for distributed PyTorch training.

    import tracekit
    run = tracekit.open("runs/job42/")   # ingests if needed
    run.sql("SELECT rank, count(*) FROM kernels GROUP BY rank")
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import NotATraceError, StoreError, TraceFileError, TracekitError  # noqa: E402


def open(path, store: str | None = None, *, ingest: bool = True, **ingest_options):  # noqa: A001
    """Open a trace directory (ingesting new or changed traces first) or a store.

    Returns a `tracekit.run.Run`. ingest_options go to `tracekit.ingest.ingest`.
    """
    from .run import open_run

    return open_run(path, store, ingest=ingest, **ingest_options)


def doctor(run, *, out_dir: str | None = None, device: str | None = None) -> list[dict]:
    """What slows the run (a tracekit Run), most predicted saving first (tracekit/advice: the app layer,
    found through its extension point). device: the catalog device its GPUs are (doctor --device)."""
    from .extensions import provider

    return provider("doctor")(run, out_dir=out_dir, device=device)


__all__ = ["open", "doctor", "TracekitError", "TraceFileError", "NotATraceError", "StoreError", "__version__"]
