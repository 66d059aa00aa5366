"""`tracekit report`: write the self-contained HTML report of a run."""
from __future__ import annotations

import click

from ._common import fail_cleanly, store_option


@click.command("report")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="HTML file to write (one file, viewable offline).")
@click.option("--title", default=None, help="Page title (default: the trace directory's name).")
@click.option("--scenario", "scenarios", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="What-if scenario (TOML/YAML; repeat for several): adds a predicted-vs-measured panel "
                   "with the baseline replay and each scenario.")
@click.option("--device", default=None, metavar="NAME",
              help="The GPU every rank ran on, a device catalog name (e.g. H100-SXM), for a trace without "
                   "deviceProperties: MFU, the roofline and low-MFU findings need the device's peaks.")
@store_option()
@fail_cleanly
def report_cmd(trace_dir, output, title, scenarios, device, store):
    """Write an HTML report of TRACE_DIR: step time, temporal breakdown, overlap,
    top kernels, collective skew, busbw vs size, stragglers, memory (needs the
    `report` extra: pip install 'tracekit[report]').

    \b
    Example:
      tracekit report runs/job42/ -o job42.html
      tracekit report runs/job42/ --store /scratch/job42.store -o job42.html
      tracekit report runs/job42/ --scenario links4x.toml -o job42.html
    """
    import tracekit
    from ..report import require_plotly
    from ..report.html import write_report
    from replay.scenario import load_scenario

    # Checked before ingesting: none needs the trace, and each is the user's to fix.
    loaded = [load_scenario(s) for s in scenarios]
    if device is not None:
        from analyses.devices import catalog, given_device

        given_device(device, catalog())
    require_plotly()
    with tracekit.open(trace_dir, store=store) as run:
        path = write_report(run, output, title=title, scenarios=loaded, device=device)
    click.echo(f"wrote {path}")
