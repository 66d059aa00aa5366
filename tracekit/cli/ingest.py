"""`tracekit ingest` and `tracekit info`."""
from __future__ import annotations

import click

from ..output import duration, to_json
from ._common import echo_err, echo_notes, emit, fail_cleanly, format_option, store_option


@click.command("ingest")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@store_option()
@click.option("--rank-from", default="auto", show_default=True, metavar="auto|filename|order|regex:PATTERN",
              help="Where a trace's rank comes from: distributedInfo then the file name (auto), the file name "
                   "(rank3, rank-3, worker3 ...), the sorted file order, or a regex with one (\\d+) group.")
@click.option("--jobs", "-j", type=click.IntRange(1, 512), default=None,
              help="Files ingested in parallel (default: one per CPU core).")
@click.option("--executor", default=None, metavar="local|local[N]|dask://HOST:PORT",
              help="Where files are ingested: the local process pool (default; local[N]: N workers) or a Dask "
                   "distributed cluster's scheduler. With Dask the trace directory and the store must be on a "
                   "filesystem every worker sees under the same path; only this process writes the manifest.")
@click.option("--skip-bad", is_flag=True, help="Leave out unreadable traces (listed) instead of failing.")
@click.option("--force", is_flag=True, help="Re-ingest every file, even unchanged ones.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing on success.")
@click.option("--nccl-tests", "nccl_tests", multiple=True, metavar="FILE",
              help="nccl-tests output (the -J JSON, or the printed table) to keep as the reference bandwidth "
                   "curve for `tracekit comms bandwidth`; repeat for several ops. Kept by later ingests until --force.")
@fail_cleanly
def ingest_cmd(trace_dir, store, rank_from, jobs, executor, skip_bad, force, quiet, nccl_tests):
    """Ingest a directory of per-rank Kineto traces into a Parquet store.

    Unchanged files are skipped; a changed file replaces its partition; a bad
    file leaves the previous store untouched.

    \b
    Example:
      tracekit ingest runs/job42/
      tracekit ingest runs/job42/ --store /scratch/job42.store --rank-from filename
      tracekit ingest runs/job42/ --nccl-tests all_reduce.json --nccl-tests all_gather_perf.txt
      tracekit ingest /shared/runs/job42/ --executor dask://scheduler:8786
    """
    from ..ingest import ingest

    r = ingest(trace_dir, store, rank_from=rank_from, jobs=jobs, skip_bad=skip_bad, force=force, nccl_tests=nccl_tests,
               executor=executor,
               on_wait=lambda: echo_err("waiting for another tracekit ingest of this store to finish ..."))
    for source, warnings in r.warnings.items():
        echo_notes(warnings, f"warning: {source}")
    for source, why in r.unopened.items():
        echo_err(f"skipped {source}: {why}")
    for source, notes in r.notes.items():
        echo_notes(notes, f"note: {source}")
    for source, why in r.failed.items():
        echo_err(f"skipped unreadable trace {source}: {why}")
    if r.decoder_note:
        echo_err(f"note: {r.decoder_note}")
    if not quiet:
        click.echo(f"store: {r.store_dir}")
        click.echo(f"ingested {len(r.ingested)} file(s), {len(r.unchanged)} unchanged, "
                   f"{len(r.removed)} removed, {len(r.skipped)} not a trace ({r.seconds:.2f} s)")
        if r.skipped:
            click.echo(f"not traces (skipped): {', '.join(sorted(r.skipped))}")


@click.command("info")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@store_option()
@format_option(("table", "json"))
@fail_cleanly
def info_cmd(trace_dir, store, fmt):
    """Summarise a run: ranks, world size, devices, steps, time span, event counts, warnings.

    Ingests new or changed traces first. Notes and warnings go to stderr.

    \b
    Example:
      tracekit info runs/job42/
      tracekit info runs/job42/ --format json
    """
    import tracekit
    from tracekit.ingest.kineto import decoder_in_use

    run = tracekit.open(trace_dir, store)
    info = run.info()
    if fmt == "json":
        click.echo(to_json({**info, "decoder": decoder_in_use()}))
        return
    ws = info["world_size"]
    click.echo(f"trace dir:  {info['trace_dir']}")
    click.echo(f"store:      {info['store']}")
    click.echo(f"ranks:      {_ranges(info['ranks'])} ({len(info['ranks'])} of world size {ws if ws else 'unknown'})")
    devices = ", ".join(info["devices"])
    if not devices:  # device ops without deviceProperties (MTIA, XPU ...) are no CPU-only run
        has_ops = info["per_rank"]["gpu_ops"].sum() > 0
        devices = "unknown (the traces have device ops but no deviceProperties)" if has_ops else "none (CPU-only trace)"
    click.echo(f"devices:    {devices}")
    click.echo(f"steps:      {_steps(info['per_rank']['steps'])}")
    if info["first_ts_ns"] is not None:
        click.echo(f"time span:  {duration(info['last_end_ns'] - info['first_ts_ns'])}")
    click.echo(f"events:     {info['event_count']}")
    click.echo("")
    cols = ["rank", "source_file", "rank_source", "steps", "event_count", "cpu_ops", "kernels", "gpu_ops",
            "span_ns", "lost_event_count"]
    emit(info["per_rank"][cols], "table")
    click.echo("")
    emit(info["categories"], "table")
    echo_notes(info["notes"])
    for src, ws_ in info["warnings"].items():
        echo_notes(ws_, f"warning: {src}")
    if info["flight_recorder_dumps"]:
        click.echo(f"flight-recorder dumps: {len(info['flight_recorder_dumps'])} (see tracekit comms check)")
    if info["skipped"]:
        click.echo(f"not traces (skipped): {', '.join(sorted(info['skipped']))}")
    click.echo(f"ingest's events decoder: {decoder_in_use()}")


def _ranges(ranks: list[int]) -> str:
    out, start, prev = [], None, None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out) or "none"


def _steps(counts) -> str:
    """What `steps` counts, so that it reads right beside replay's figure (the steps in its medians)."""
    lo, hi = (int(counts.min()), int(counts.max())) if len(counts) else (0, 0)
    if not hi:
        return "0 (no ProfilerStep#N annotations: replay has no step to compare)"
    span = hi if lo == hi else f"{lo}-{hi}"
    if hi == 1:
        return f"{span} a rank (ProfilerStep#N annotations)"
    return (f"{span} a rank (ProfilerStep#N annotations; replay's median step leaves "
            "out each rank's last, which the profiler may cut short)")

