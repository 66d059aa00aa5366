"""`tracekit comms`: communication across ranks (collectives, stragglers, bandwidth, clock offsets,
flight-recorder checks). Thin commands over analyses/comms.py."""
from __future__ import annotations

import click

from ..output import rate, size, to_json
from ._common import echo_err, emit_result, fail_cleanly, format_option, store_option

_trace_dir = click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
_aligned = click.option("--aligned", is_flag=True,
                        help="Shift each rank's times by its clock offset estimated from matched collectives "
                             "(see `tracekit comms align`); the offsets are printed on stderr.")


def _open(trace_dir, store):
    import tracekit

    return tracekit.open(trace_dir, store)


@click.group("comms", context_settings={"help_option_names": ["-h", "--help"]})
def comms_group():
    """Communication across ranks: matched collectives, stragglers, bandwidth, clock offsets, hangs.

    \b
    Example:
      tracekit comms collectives runs/job42/
      tracekit comms stragglers runs/job42/ --format json
      tracekit comms check runs/job42/
      tracekit comms exposed runs/job42/ --rank 0
    """


@comms_group.command("collectives")
@_trace_dir
@store_option()
@format_option()
@click.option("--per-rank", is_flag=True, help="One row per (rank, collective) instead of one per matched collective.")
@click.option("--rank", type=int, default=None, help="With --per-rank: only this rank.")
@click.option("--op", default=None, help="Only this op (all_reduce, all_gather, reduce_scatter, broadcast, ...).")
@_aligned
@fail_cleanly
def collectives_cmd(trace_dir, store, fmt, per_rank, rank, op, aligned):
    """Collectives matched across ranks: participants, arrival skew, transfer time, algbw / busbw.

    Stable JSON columns: match_key, op, bytes, participants, arrival_skew_ns,
    transfer_ns, algbw_gbps, busbw_gbps (and more).

    \b
    Example:
      tracekit comms collectives runs/job42/
      tracekit comms collectives runs/job42/ --op all_reduce --format json
      tracekit comms collectives runs/job42/ --per-rank --rank 3
    """
    from analyses import comms

    run = _open(trace_dir, store)
    if per_rank:
        df = comms.collectives(run, rank, op=op, aligned=aligned)
    else:
        if rank is not None:
            raise click.UsageError("--rank needs --per-rank")
        df = comms.collectives_matched(run, op, aligned=aligned)
    if fmt == "table":
        keep = ["match_key", "op", "bytes", "n_participants", "arrival_skew_ns", "last_arrival_rank", "transfer_ns",
                "algbw_gbps", "busbw_gbps", "complete"] if not per_rank else [
                "rank", "match_key", "op", "bytes", "timeline", "start_ns", "dur_ns", "arrival_delay_ns", "wait_ns"]
        df = df[[c for c in keep if c in df.columns]]
    emit_result(df, fmt)


@comms_group.command("stragglers")
@_trace_dir
@store_option()
@format_option()
@click.option("--by-step", is_flag=True, help="One ranking per ProfilerStep.")
@_aligned
@fail_cleanly
def stragglers_cmd(trace_dir, store, fmt, by_step, aligned):
    """Which rank arrived last at collectives, by how much, and how much waiting it caused.

    One row per rank (per step with --by-step), most harmful first. Stable JSON
    columns: rank, late_count, avg_delay_ns, caused_wait_ns (and more).

    \b
    Example:
      tracekit comms stragglers runs/job42/
      tracekit comms stragglers runs/job42/ --by-step --format json
    """
    from analyses import comms

    df = comms.straggler_attribution(_open(trace_dir, store), by_step=by_step, aligned=aligned)
    if not by_step:
        df = df.drop(columns=["step"])
    late = df[df["consistently_late"]]
    if fmt == "table":
        for row in late.itertuples():
            echo_err(f"straggler: rank {row.rank} arrived last at {row.late_count} of {row.collectives} collectives, "
                     f"{row.avg_delay_ns / 1e6:.2f} ms late on average, costing the others "
                     f"{row.caused_wait_ns / 1e6:.1f} ms of waiting")
    emit_result(df, fmt)


@comms_group.command("check")
@_trace_dir
@store_option()
@format_option()
@fail_cleanly
def check_cmd(trace_dir, store, fmt):
    """Check flight-recorder dumps: collectives not joined by every rank, mismatches, last completed.

    Reads the per-rank dumps in TRACE_DIR (rank<R>.fr.json, or pickles through a
    restricted loader that refuses anything but plain data). JSON output is an
    object {"issues": [...], "last_completed": [...]}; exit code 0 either way.

    \b
    Example:
      tracekit comms check runs/job42/
      tracekit comms check runs/hung_job/ --format json
    """
    from analyses import comms

    from ..errors import TracekitError

    run = _open(trace_dir, store)
    if not comms.has_flight_recorder(run):
        raise TracekitError(f"{trace_dir}: {comms.NO_FR}")
    issues = comms.comms_check(run)
    last = comms.comms_last_completed(run)
    if fmt == "json":
        click.echo(to_json({"issues": issues, "last_completed": last}))
        return
    if issues.empty:
        click.echo("flight recorder: every rank joined every collective it could have, with the same op, size and dtype")
    else:
        click.echo(f"flight recorder: {len(issues)} problem(s)")
        emit_result(issues, fmt)
    click.echo("")
    emit_result(last, fmt)


@comms_group.command("align")
@_trace_dir
@store_option()
@format_option()
@fail_cleanly
def align_cmd(trace_dir, store, fmt):
    """Estimate each rank's clock offset from matched collectives (their ends are near-simultaneous).

    Prints the correction to add to each rank's times, relative to the lowest
    rank. Nothing is changed: pass --aligned to `comms collectives` /
    `comms stragglers` to apply the offsets (they are printed again there).

    \b
    Example:
      tracekit comms align runs/job42/
      tracekit comms stragglers runs/job42/ --aligned
    """
    from analyses import comms

    emit_result(comms.clock_offsets(_open(trace_dir, store)), fmt)


@comms_group.command("bandwidth")
@_trace_dir
@store_option()
@format_option()
@click.option("--op", default=None, help="Only this op (all_reduce, all_gather, ...).")
@click.option("--below-ref-pct", type=float, default=50.0, show_default=True,
              help="Flag collectives whose busbw is under this percentage of the nccl-tests reference at their size.")
@_aligned
@fail_cleanly
def bandwidth_cmd(trace_dir, store, fmt, op, below_ref_pct, aligned):
    """Bus bandwidth per process group, op and message-size bucket (nccl-tests factors).

    With an nccl-tests reference in the store (`tracekit ingest DIR --nccl-tests
    FILE`), each bucket also gives ref_busbw_gbps, busbw_vs_ref_pct and how many
    collectives fell under --below-ref-pct of the reference.

    \b
    Example:
      tracekit comms bandwidth runs/job42/
      tracekit comms bandwidth runs/job42/ --op all_reduce --format csv
      tracekit ingest runs/job42/ --nccl-tests all_reduce.json
      tracekit comms bandwidth runs/job42/ --below-ref-pct 70
    """
    from analyses import comms

    df = comms.bandwidth_report(_open(trace_dir, store), op, below_ref_pct=below_ref_pct, aligned=aligned)
    if fmt == "table":
        for row in df[df["below_ref_count"] > 0].itertuples():
            echo_err(f"below reference: {row.below_ref_count} {row.op} collective(s) of ~{size(row.size_bucket_bytes)} "
                     f"at {row.busbw_vs_ref_pct:.0f}% of nccl-tests busbw ({rate(row.ref_busbw_gbps)})")
    emit_result(df, fmt)


@comms_group.command("exposed")
@_trace_dir
@store_option()
@format_option()
@click.option("--rank", type=int, default=None, help="Only this rank.")
@click.option("--step", type=int, default=None, help="Only this ProfilerStep#N.")
@fail_cleanly
def exposed_cmd(trace_dir, store, fmt, rank, step):
    """Exposed communication per rank and step: communication time not hidden behind compute.

    GPU ranks: communication kernels against compute kernels (the figures of
    `tracekit analyze comm_comp_overlap --by-step`). gloo ranks: each collective
    (call start -> runloop end) against the CPU ops of the thread that called it.
    Stable JSON columns: rank, step, timeline, comm_ns, overlapped_ns,
    exposed_comm_ns, exposed_pct, step_ns, exposed_step_pct.

    \b
    Example:
      tracekit comms exposed runs/job42/
      tracekit comms exposed runs/job42/ --rank 0 --step 3
      tracekit comms exposed runs/job42/ --format json
    """
    from analyses.exposed_comm import exposed_comm

    emit_result(exposed_comm(_open(trace_dir, store), rank, step), fmt)
