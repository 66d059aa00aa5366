"""Shared CLI pieces: the --format option, table/CSV/JSON output (the contract is tracekit.output),
notes on stderr, error handling."""
from __future__ import annotations

import functools

import click

from ..errors import TracekitError
from ..output import FORMATS, render


def format_option(formats: tuple[str, ...] = FORMATS):
    scripts = " or ".join(f.upper() for f in formats if f != "table")
    return click.option("--format", "fmt", type=click.Choice(formats), default="table", show_default=True,
                        help=f"Output format: an aligned table for people (human units, the unit left out of the "
                             f"column name, columns empty on every row left out), {scripts} for scripts "
                             "(raw numbers, the unit in the column name, every column).")


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
    """Print a DataFrame as a table, CSV or JSON (tracekit.output.render)."""
    click.echo(render(df, fmt), nl=False)


def emit_result(df, fmt: str) -> None:
    """A library result: its note (df.attrs["note"]) on stderr, then the frame on stdout."""
    echo_notes([df.attrs["note"]] if df.attrs.get("note") else [])
    emit(df, fmt)


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def echo_notes(notes, label: str = "note") -> None:
    """Notes (what a result means, what was assumed) go to stderr in every format, so stdout
    stays the result alone."""
    for note in notes:
        echo_err(f"{label}: {note}")
