"""`tracekit replay`: re-time a run with the discrete-event engine (baseline or one scenario)."""
from __future__ import annotations

import os

import click

from ..output import to_json
from ._common import echo_notes, emit, fail_cleanly, format_option, store_option


def parse_ranks(text: str | None):
    """'0,1,4-7' -> [0, 1, 4, 5, 6, 7]; None -> None."""
    from ..errors import TracekitError

    if not text:
        return None
    out = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise TracekitError(f"--ranks {text!r}: expected rank numbers and ranges, e.g. 0,1,4-7") from None
    if not out:
        raise TracekitError(f"--ranks {text!r}: no ranks given")
    return out


CHROME_TRACE = "replay.chrome.json.gz"


def fold_mode(flag, out):
    """--fold/--no-fold as given; else off when a re-timed store is written, automatic otherwise."""
    from ..errors import TracekitError

    if flag and out:
        raise TracekitError("--fold with --out: folded ranks have no events of their own to write; drop --fold")
    if flag is None:
        return False if out else "auto"
    return flag


@click.command("replay")
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--scenario", "scenario", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="What-if scenario (TOML or YAML); default: the baseline (nothing changed).")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None, metavar="OUT_DIR",
              help=f"Write the re-timed run as a store at OUT_DIR (same schema as a measured run: every "
                   f"command works on it) plus OUT_DIR/{CHROME_TRACE} for Perfetto / chrome://tracing.")
@click.option("--ranks", "ranks", default=None, metavar="LIST",
              help="Replay only these ranks (e.g. 0,1,4-7); peers outside them arrive as measured.")
@click.option("--steps", "show_steps", is_flag=True, help="Print every step instead of the per-rank medians.")
@click.option("--fold/--no-fold", "fold", default=None,
              help="Replay ranks whose graphs are identical up to 5% of timing once (default: on above 64 "
                   "ranks, off with --out, which re-times every rank's events).")
@format_option()
@store_option()
@fail_cleanly
def replay_cmd(trace_dir, scenario, out, ranks, show_steps, fold, fmt, store):
    """Replay TRACE_DIR's dependency graph (CPU threads, GPU streams, collectives across ranks) with
    the discrete-event engine and compare each rank's median step time with the measured one.

    \b
    Example:
      tracekit replay runs/job42/
      tracekit replay runs/job42/ --format json
      tracekit replay runs/job42/ --scenario links4x.toml --out runs/job42-links4x/
    """
    import tracekit
    import replay as _replay

    rank_list = parse_ranks(ranks)
    with tracekit.open(trace_dir, store=store) as run:
        result = _replay.run(run, scenario, ranks=rank_list, fold=fold_mode(fold, out))
        written = None
        if out:
            written = result.write_store(out)
            from replay.chrome import write_chrome_trace

            write_chrome_trace(written, os.path.join(written, CHROME_TRACE))
    d = result.to_dict()
    echo_notes(d["notes"])
    if fmt == "json":
        if show_steps:
            d["steps"] = result.steps
        if written:
            d["out"] = written
        click.echo(to_json(d))
        return
    summary = result.summary()
    emit(result.steps if show_steps else summary, fmt)
    if fmt == "table":
        click.echo("" if show_steps else f"\nsteps: {_steps_line(summary['steps'], result.steps)}")
        click.echo(f"{d['nodes']:,} nodes, {d['edges']:,} edges, {d['collectives']:,} collectives; "
                   f"graph {d['build_s']:.2f} s, replay {d['replay_s']:.3f} s; worst rank error {d['error_pct']:+.2f}%")
        if written:
            click.echo(f"wrote {written} (store) and {os.path.join(written, CHROME_TRACE)}")


def _steps_line(used, steps) -> str:
    """What the summary's `steps` counts beside `tracekit info`'s steps (every ProfilerStep#N annotation)."""
    per_rank = steps.groupby("rank").size()
    n_used = sorted({int(n) for n in used})
    n_all = sorted({int(n) for n in per_rank})
    if len(n_used) == 1 and len(n_all) == 1 and n_used[0] < n_all[0]:
        return (f"the medians take {n_used[0]} of the {n_all[0]} steps replayed a rank, the last left out (the "
                "profiler may cut it short); --steps lists every one")
    return "the steps replayed a rank that the medians take (a rank's last is left out when it has others)"

