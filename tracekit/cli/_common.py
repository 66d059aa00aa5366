"""Shared CLI pieces: the --format option, table/CSV/JSON output (the contract is tracekit.output),
notes on stderr, error handling."""
from __future__ import annotations

import functools
import io

import click

from ..errors import TracekitError
from ..output import human, json_value, to_json, unit_of

FORMATS = ("table", "csv", "json")


def format_option(formats: tuple[str, ...] = FORMATS):
    scripts = " or ".join(f.upper() for f in formats if f != "table")
    return click.option("--format", "fmt", type=click.Choice(formats), default="table", show_default=True,
                        help=f"Output format: an aligned table for people (human units), {scripts} for scripts "
                             "(raw numbers, the unit in the column name).")


def store_option():
    return click.option("--store", "store", type=click.Path(file_okay=False), default=None,
                        help="Store directory (default: TRACE_DIR/.tracekit, or a per-user cache "
                             "directory when TRACE_DIR is read-only).")


def fail_cleanly(fn):
    """Library errors become one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TracekitError as e:
            raise _Fail(str(e)) from None

    return wrapper


class _Fail(click.ClickException):
    exit_code = 2

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True)


def emit(df, fmt: str) -> None:
    """Print a DataFrame as a table (human units, see tracekit.output), CSV or JSON (a list of row
    objects); CSV and JSON keep the raw numbers."""
    if fmt == "json":
        click.echo(to_json(df))
    elif fmt == "csv":
        buf = io.StringIO()
        df.to_csv(buf, index=False)
        click.echo(buf.getvalue(), nl=False)
    else:
        click.echo(render_table(df))


def emit_result(df, fmt: str) -> None:
    """A library result: its note (df.attrs["note"]) on stderr, then the frame on stdout."""
    echo_notes([df.attrs["note"]] if df.attrs.get("note") else [])
    emit(df, fmt)


def render_table(df) -> str:
    if df.empty:
        return "(no rows)\n" + "  ".join(str(c) for c in df.columns)
    cols = [str(c) for c in df.columns]
    units = [unit_of(c) for c in cols]
    raw = [[json_value(v) for v in row] for row in df.itertuples(index=False, name=None)]
    cells = [[_cell(v, u) for v, u in zip(row, units)] for row in raw]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    numeric = [all(v is None or _is_num(v) for v in (r[i] for r in raw)) for i in range(len(cols))]
    fmt = lambda vals: "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric)).rstrip()  # noqa: E731
    lines = [fmt(cols), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells]
    return "\n".join(lines)


def _cell(v, unit: str | None) -> str:
    if v is None:
        return ""
    shown = human(v, unit)
    if shown is not None:
        return shown
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.0f}"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _is_num(v) -> bool:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return True
    try:
        float(str(v))
        return True
    except ValueError:
        return False


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def echo_notes(notes, label: str = "note") -> None:
    """Notes (what a result means, what was assumed) go to stderr in every format, so stdout
    stays the result alone."""
    for note in notes:
        echo_err(f"{label}: {note}")
