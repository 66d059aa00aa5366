"""`tracekit query`: SQL over a run's store."""
from __future__ import annotations

import click

from ._common import emit, fail_cleanly, format_option, store_option


@click.command("query")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("sql")
@store_option()
@format_option()
@click.option("--allow-external-access", is_flag=True,
              help="Let the SQL read and write files and load extensions (off by default: queries see only the store).")
@fail_cleanly
def query_cmd(trace_dir, sql, store, fmt, allow_external_access):
    """Run SQL (DuckDB dialect) over the views events, kernels, gpu_ops, cpu_ops,
    runtime, steps, ranks, flows, memory. Ingests new or changed traces first.

    \b
    Example:
      tracekit query runs/job42/ "SELECT rank, count(*) AS kernels FROM kernels GROUP BY rank"
      tracekit query runs/job42/ "SELECT name, sum(dur_ns) FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT 5" --format csv
    """
    import tracekit

    run = tracekit.open(trace_dir, store)
    run.allow_external_access = allow_external_access
    emit(run.sql(sql), fmt)
