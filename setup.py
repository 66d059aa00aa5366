"""The one compiled part: tracekit/ingest/_events.c, the events decoder of ingest's fast path.

Optional: without a C compiler the build goes on without it and ingest takes DuckDB's JSON reader for
every run (the same store; ingest takes ~1.8x as long, CPU seconds on bench/ingest.py's trace). pip shows
a build's output only with -v, so the user hears of it where it matters as well: ingest says so in a note,
and `tracekit info` names the decoder in use (tracekit/ingest/kineto.py, decoder_in_use).
"""
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_NOT_BUILT = """
************************************************************************************************
WARNING: tracekit's compiled events decoder (tracekit/ingest/_events.c) was not built:
  {error}
tracekit works without it, but ingest reads every event with DuckDB's JSON reader and takes ~1.8x
as long. Install a C compiler (e.g. apt-get install gcc) and run pip install again.
************************************************************************************************
"""


class _BuildExt(build_ext):
    """build_ext that says, on stderr, why the optional decoder was not built (setuptools only logs it)."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, a missing compiler (DistutilsExecError, OSError) ...
            sys.stderr.write(_NOT_BUILT.format(error=f"{type(e).__name__}: {e}"))
            sys.stderr.flush()
            raise  # the Extension is optional: setuptools goes on without it


setup(ext_modules=[Extension("tracekit.ingest._events", ["tracekit/ingest/_events.c"],
                             extra_compile_args=["-O2", "-std=c11"], optional=True)],
      cmdclass={"build_ext": _BuildExt})
