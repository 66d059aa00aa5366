"""`tracekit --version` and `--help` start fast: the CLI imports what a command uses when it runs.

Checked by what the process imported (sys.modules in a fresh interpreter), never by a clock."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("duckdb", "pandas", "pyarrow", "numpy", "numba", "msgspec")

_PROBE = """
import json, sys
from tracekit.cli import main
sys.argv = ["tracekit", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
print()
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["ingest", "--help"], ["comms", "--help"],
                                  ["gate", "--help"], ["analyze", "--help"]])
def test_help_and_version_import_no_heavy_library(args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True,
                         env=env, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) > 1, out.stdout  # the command printed its help or version before the probe's line
    imported = set(json.loads(lines[-1]))
    assert not imported & set(HEAVY), f"tracekit {' '.join(args)} imported {sorted(imported & set(HEAVY))}"
