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


def test_the_lazy_command_list_is_the_commands():
    """`tracekit --help` lists the commands from tracekit.cli.COMMANDS without importing them: each entry
    resolves to its command, and its help line is the first paragraph of that command's help, so the
    listing is what click would print from the commands themselves."""
    import click
    from click.testing import CliRunner

    from tracekit.cli import COMMANDS, cli

    ctx = click.Context(cli)
    eager = click.Group("tracekit", help=cli.help, params=cli.params,
                        context_settings={"help_option_names": ["-h", "--help"]})
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name
        assert " ".join(cmd.help.split("\b")[0].strip().split("\n\n")[0].split()) == COMMANDS[name][2], name
        eager.add_command(cmd)
    lazy_help = CliRunner().invoke(cli, ["--help"], prog_name="tracekit").output
    assert lazy_help == CliRunner().invoke(eager, ["--help"], prog_name="tracekit").output
    assert cli.get_command(ctx, "no-such-command") is None


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_help_and_version_import_no_command_module(args):
    probe = _PROBE.replace('{m.split(".")[0] for m in sys.modules}', '{m for m in sys.modules if m.startswith("tracekit.cli.")}')
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(args)], capture_output=True, text=True, env=env,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
