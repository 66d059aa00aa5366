"""`tracekit doctor`: what slows this job, ranked, each with its fix and the replay's predicted saving."""
from __future__ import annotations

import click

from ..output import to_json
from ._common import fail_cleanly, store_option


@click.command("doctor")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--format", "fmt", type=click.Choice(("table", "json", "markdown")), default="table", show_default=True,
              help="A ranked list for people, JSON (a list of findings, most saving first) for scripts, or Markdown.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write each finding's scenario there as <name>.toml (tracekit whatif TRACE_DIR DIR/<name>.toml "
                   "reproduces its prediction).")
@click.option("--device", default=None, metavar="NAME",
              help="The GPU every rank ran on, a device catalog name (e.g. H100-SXM), for a trace without "
                   "deviceProperties: low MFU needs the device's roofline, the memory findings its capacity "
                   "(TRACEKIT_DEVICE_CATALOG=FILE adds devices).")
@store_option()
@fail_cleanly
def doctor_cmd(trace_dir, fmt, out, device, store):
    """Rank what slows the run in TRACE_DIR: stragglers, exposed communication, host-bound launches,
    data loading, syncs, small kernels, low MFU, pipeline imbalance, out-of-memory risk, memory headroom; each with the evidence
    from the analyses, the fix and the step time the replay predicts under it.

    \b
    Example:
      tracekit doctor runs/job42/
      tracekit doctor runs/job42/ --format json --out fixes/
      tracekit doctor runs/job42/ --device H100-SXM
      tracekit whatif runs/job42/ fixes/straggler_rank1.toml
    """
    import tracekit
    from tracekit.advice import doctor
    from tracekit.advice.render import markdown, table

    with tracekit.open(trace_dir, store=store) as run:
        findings = doctor(run, out_dir=out, device=device)
    if fmt == "json":
        click.echo(to_json(findings))
    else:
        click.echo((markdown if fmt == "markdown" else table)(findings), nl=False)
