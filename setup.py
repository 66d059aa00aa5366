"""The one compiled part: tracekit/ingest/_events.c, the events decoder of ingest's fast path.

Optional: without a C compiler the build goes on without it and ingest takes DuckDB's JSON reader for
every run (the same store, about half the speed).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.ingest._events", ["tracekit/ingest/_events.c"],
                             extra_compile_args=["-O2", "-std=c11"], optional=True)])
