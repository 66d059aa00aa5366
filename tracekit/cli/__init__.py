"""The `tracekit` command: a thin click group over the library."""
from __future__ import annotations

import click

from .. import __version__
from .capture import demo_train_cmd, record_cmd, testbed_group
from .analyze import analyze_cmd
from .comms import comms_group
from .doctor import doctor_cmd
from .gate import gate_cmd
from .ingest import ingest_cmd, info_cmd
from .query import query_cmd
from .replay import replay_cmd
from .report import report_cmd
from .whatif import whatif_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def cli():
    """Profile and replay distributed PyTorch training from its traces.

    \b
    Example:
      tracekit ingest runs/job42/
      tracekit info runs/job42/
      tracekit query runs/job42/ "SELECT rank, count(*) FROM kernels GROUP BY rank"
    """


cli.add_command(ingest_cmd)
cli.add_command(info_cmd)
cli.add_command(query_cmd)
cli.add_command(analyze_cmd)
cli.add_command(record_cmd)
cli.add_command(demo_train_cmd)
cli.add_command(testbed_group)
cli.add_command(comms_group)
cli.add_command(report_cmd)
cli.add_command(gate_cmd)
cli.add_command(doctor_cmd)
cli.add_command(replay_cmd)
cli.add_command(whatif_cmd)


def main() -> None:
    cli(prog_name="tracekit")
