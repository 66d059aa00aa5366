"""`python -m tracekit.ingest`: one ingest worker process (see worker.py)."""
from .worker import _serve

_serve()
