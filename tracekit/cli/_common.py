"""Shared CLI pieces: the --format option, table/CSV/JSON output, error handling."""
from __future__ import annotations

import functools
import io
import json
import math

import click

from ..errors import TracekitError

FORMATS = ("table", "csv", "json")


def format_option(default: str = "table"):
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default=default, show_default=True,
                        help="Output format: an aligned table for people, CSV or JSON for scripts.")


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


def _jsonable(v):
    if v is None:
        return None
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def emit(df, fmt: str) -> None:
    """Print a DataFrame as a table, CSV or JSON (a list of row objects)."""
    if fmt == "json":
        rows = [{k: _jsonable(v) for k, v in row.items()} for row in df.to_dict(orient="records")]
        click.echo(json.dumps(rows, indent=1, default=str))
    elif fmt == "csv":
        buf = io.StringIO()
        df.to_csv(buf, index=False)
        click.echo(buf.getvalue(), nl=False)
    else:
        click.echo(render_table(df))


def render_table(df) -> str:
    if df.empty:
        return "(no rows)\n" + "  ".join(str(c) for c in df.columns)
    cols = [str(c) for c in df.columns]
    cells = [[_cell(v) for v in row] for row in df.itertuples(index=False, name=None)]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    numeric = [all(_is_num(r[i]) for r in cells) for i in range(len(cols))]
    fmt = lambda vals: "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric)).rstrip()  # noqa: E731
    lines = [fmt(cols), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells]
    return "\n".join(lines)


def _cell(v) -> str:
    v = _jsonable(v)
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.0f}"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _is_num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return s == ""


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)

