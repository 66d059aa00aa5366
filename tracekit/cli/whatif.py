"""`tracekit whatif`: compare what-if scenarios against the measured run."""
from __future__ import annotations

import click

from ._common import echo_notes, emit, fail_cleanly, format_option, store_option
from .replay import fold_mode


@click.command("whatif")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("scenarios", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="SCENARIO...")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write each scenario's re-timed run as a store under DIR/<scenario name>/.")
@click.option("--fold/--no-fold", "fold", default=None,
              help="Replay ranks identical up to 5% of timing once (default: on above 64 ranks, off with --out).")
@click.option("--executor", default=None, metavar="dask://HOST:PORT",
              help="Run the passes over every rank's events (the folding's plan, the measured exposed communication) "
                   "in chunks of ranks on this Dask cluster (the store on a filesystem every worker sees under the "
                   "same path).")
@format_option()
@store_option()
@fail_cleanly
def whatif_cmd(trace_dir, scenarios, out, fold, executor, fmt, store):
    """Replay TRACE_DIR under each SCENARIO file (TOML or YAML) and compare predicted step time,
    throughput and exposed communication with the measured run.

    \b
    Example:
      printf '[network]\\nbandwidth_scale = 4.0\\n' > links4x.toml
      tracekit whatif runs/job42/ links4x.toml
      tracekit whatif runs/job42/ links4x.toml dp4.toml ocs.toml --format json
      tracekit whatif /shared/runs/job42/ links4x.toml --executor dask://scheduler:8786
    """
    import tracekit
    from replay.scenario import load_scenario
    from replay.whatif import whatif

    loaded = [load_scenario(s) for s in scenarios]  # a bad file fails before any ingest or replay
    if executor is not None:
        from tracekit.ingest.executor import as_executor

        executor = as_executor(executor)  # so does a bad --executor
    with tracekit.open(trace_dir, store=store) as run:
        df = whatif(run, loaded, out_dir=out, fold=fold_mode(fold, out), executor=executor)
    for name, notes in df.attrs.get("notes", {}).items():
        echo_notes(notes, f"note ({name})")
    # JSON: the scenarios only (scripts compare them with the measured figures already in each row)
    emit(df[df["scenario"] != "measured"] if fmt == "json" else df, fmt)
