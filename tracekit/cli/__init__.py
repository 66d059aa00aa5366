"""The `tracekit` command: a thin click group over the library.

Each command's module is imported when that command runs: `tracekit --version` and `--help` import none
of them (their click definitions cost ~30 ms of a 0.1 s start). `tracekit --help` lists the commands from
COMMANDS; tests/test_cli_startup.py checks that list against the commands themselves.
"""
from __future__ import annotations

import importlib

import click

from .. import __version__

# name -> (module of tracekit.cli, attribute, the first paragraph of the command's help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "analyze": ("analyze", "analyze_cmd",
                "Run analysis NAME over TRACE_DIR (ingesting new or changed traces first)."),
    "comms": ("comms", "comms_group",
              "Communication across ranks: matched collectives, stragglers, bandwidth, clock offsets, hangs."),
    "demo-train": ("capture", "demo_train_cmd",
                   "Train a tiny transformer with DDP on gloo (CPU) and capture every rank."),
    "demo-layout": ("capture", "demo_layout_cmd",
                    "Train a small transformer under one parallel layout on gloo (CPU) and capture every rank."),
    "doctor": ("doctor", "doctor_cmd",
               "Rank what slows the run in TRACE_DIR: stragglers, exposed communication, host-bound launches, "
               "data loading, syncs, small kernels, low MFU, pipeline imbalance, out-of-memory risk, memory "
               "headroom; each with the evidence from the analyses, the fix and the step time the replay predicts "
               "under it."),
    "gate": ("gate", "gate_cmd",
             "Compare CANDIDATE against BASELINE (trace directories or stores, measured or replayed)."),
    "info": ("ingest", "info_cmd",
             "Summarise a run: ranks, world size, devices, steps, time span, event counts, warnings."),
    "ingest": ("ingest", "ingest_cmd", "Ingest a directory of per-rank Kineto traces into a Parquet store."),
    "query": ("query", "query_cmd",
              "Run SQL (DuckDB dialect) over the views events, kernels, gpu_ops, cpu_ops, runtime, steps, "
              "ranks, flows, memory. Ingests new or changed traces first."),
    "record": ("capture", "record_cmd", "Run a training command and gather its ranks' traces into one directory."),
    "replay": ("replay", "replay_cmd",
               "Replay TRACE_DIR's dependency graph (CPU threads, GPU streams, collectives across ranks) with "
               "the discrete-event engine and compare each rank's median step time with the measured one."),
    "report": ("report", "report_cmd",
               "Write an HTML report of TRACE_DIR: step time, temporal breakdown, overlap, top kernels, "
               "collective skew, busbw vs size, stragglers, memory (needs the `report` extra: pip install "
               "'tracekit[report]')."),
    "testbed": ("capture", "testbed_group",
                "A multi-host testbed on this machine: network namespaces joined by shaped links."),
    "whatif": ("whatif", "whatif_cmd",
               "Replay TRACE_DIR under each SCENARIO file (TOML or YAML) and compare predicted step time, "
               "throughput and exposed communication with the measured run."),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported when one is resolved (to run it, or for its own --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # as click.Group lists them, from COMMANDS' help lines instead of the imported commands
        stand_ins = [(name, click.Command(name, help=COMMANDS[name][2])) for name in self.list_commands(ctx)]
        limit = formatter.width - 6 - max(len(name) for name, _ in stand_ins)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in stand_ins])


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def cli():
    """Profile and replay distributed PyTorch training from its traces.

    \b
    Example:
      tracekit ingest runs/job42/
      tracekit info runs/job42/
      tracekit query runs/job42/ "SELECT rank, count(*) FROM kernels GROUP BY rank"
    """


def main() -> None:
    cli(prog_name="tracekit")
