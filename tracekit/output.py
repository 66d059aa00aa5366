"""The output contract of the front doors (CLI and gate): the one renderer of a result as an aligned
table, CSV or JSON (`render`), the one way a value becomes JSON, and the one way a number becomes text
for people.

JSON is for scripts: every missing value (None, NaN, inf, pandas NA/NaT) is `null`, numpy
scalars are plain numbers, timestamps are ISO strings, and numbers stay raw, with the unit in
the field's name (`dur_ns`, `bytes`, `busbw_gbps`). CSV keeps the same raw numbers and names, and
both keep every column.

The table is for people: a number whose name carries a unit is shown in a human unit, under its
name without the raw unit (`span_ns` is the column `span`, reading `211 ms`; `people_name`):
  `*_ns`      a duration: 850 ns, 12.3 µs, 89.5 ms, 1.23 s; a point in time (`ts_ns`,
              `*_start_ns`, `*_end_ns`, `*_arrival_ns`, `time_*_ns`) stays a raw integer
              under its raw name: it is a position on the trace's clock, not an amount;
  `*_bytes`, `bytes`   a size: 512 B, 4.0 KiB, 1.5 MiB, 2.0 GiB;
  `*_gbps`    a rate: 12.3 GB/s (51.9 MB/s under 1 GB/s).
A column empty on every row (a what-if's failure columns when the scenario has no failures) is left
out of the table.
"""
from __future__ import annotations

import io
import json
import math
import re

FORMATS = ("table", "csv", "json")

# names of points in time: raw nanoseconds on the trace's clock, never humanised
_INSTANT = re.compile(r"(^|_)(ts|start|end|arrival)_ns$|^time_.*_ns$")


def json_value(v):
    """One value as JSON sees it: null for every kind of missing, plain Python numbers."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if hasattr(v, "item") and not hasattr(v, "__len__"):  # numpy scalars
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or hasattr(v, "tolist"):  # numpy arrays: a list
        return [json_value(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
    if _is_missing(v):
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def records(df) -> list[dict]:
    """A DataFrame as JSON rows (a list of objects, one per row)."""
    return [{str(k): json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def to_json(doc) -> str:
    """The JSON text of doc (a DataFrame, or dicts and lists holding DataFrames and values)."""
    return json.dumps(_tree(doc), indent=1, default=str, allow_nan=False)


def _tree(doc):
    if hasattr(doc, "to_dict") and hasattr(doc, "columns"):
        return records(doc)
    if isinstance(doc, dict):
        return {str(k): _tree(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_tree(v) for v in doc]
    return json_value(doc)


def _is_missing(v) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def render(df, fmt: str) -> str:
    """A DataFrame as text in `fmt` (one of FORMATS), ending in a newline: an aligned table for people,
    CSV, or JSON (a list of row objects)."""
    if fmt == "json":
        return to_json(df) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        df.to_csv(buf, index=False)
        return buf.getvalue()
    if fmt != "table":
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    return table(df) + "\n"


def table(df) -> str:
    """df as an aligned text table for people: human units under people's names, empty columns left out."""
    cols = [str(c) for c in df.columns]
    names = dict(zip(cols, people_names(cols)))
    if df.empty:
        return "(no rows)\n" + "  ".join(names[c] for c in cols)
    units = [unit_of(c) for c in cols]
    raw = [[json_value(v) for v in row] for row in df.itertuples(index=False, name=None)]
    cells = [[_cell(v, u) for v, u in zip(row, units)] for row in raw]
    keep = [i for i in range(len(cols)) if any(r[i] for r in cells)] or list(range(len(cols)))
    heads = [names[cols[i]] for i in keep]
    cells = [[r[i] for i in keep] for r in cells]
    widths = [max(len(h), *(len(r[j]) for r in cells)) for j, h in enumerate(heads)]
    numeric = [all(v is None or _is_num(v) for v in (r[i] for r in raw)) for i in keep]
    line = lambda vals: "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric)).rstrip()  # noqa: E731
    return "\n".join([line(heads), "  ".join("-" * w for w in widths)] + [line(r) for r in cells])


def people_names(columns: list[str]) -> list[str]:
    """people_name of each column, except where that would give two columns one name (then the raw name)."""
    shown = [people_name(c) for c in columns]
    return [p if shown.count(p) == 1 and (p == c or p not in columns) else c for c, p in zip(columns, shown)]


def people_name(name: str) -> str:
    """The name a value is shown under where the table renders it in a human unit: the raw unit dropped
    (`span_ns` -> `span`, `busbw_gbps` -> `busbw`); a name without such a unit is unchanged. A qualified name
    (`busbw_gbps:all_reduce`, the gate's metrics) drops the unit of its first part."""
    head, sep, rest = name.partition(":")
    unit = unit_of(head)
    if unit is None or head == "bytes" or head == f"_{unit}":
        return name
    return head[: -len("_" + unit)] + sep + rest


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


def unit_of(column: str) -> str | None:
    """The human unit family of a column by its name: 'ns', 'bytes', 'gbps' or None (shown as is)."""
    if column.endswith("_ns"):
        return None if _INSTANT.search(column) else "ns"
    if column == "bytes" or column.endswith("_bytes"):
        return "bytes"
    if column.endswith("_gbps"):
        return "gbps"
    return None


def human(value, unit: str | None) -> str | None:
    """value (a number in unit 'ns', 'bytes' or 'gbps') as text for people; None when unit is
    not one of those or value is not a number."""
    if unit not in _HUMAN or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return _HUMAN[unit](value)


def duration(ns: float) -> str:
    for scale, name in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{_digits(ns / scale)} {name}"
    return f"{_digits(ns)} ns"


def size(n_bytes: float) -> str:
    for scale, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.1f} {name}"
    return f"{n_bytes:.0f} B"


def rate(gbps: float) -> str:
    if gbps and abs(gbps) < 1:  # a slow link or a tiny message: 51.9 MB/s reads better than 0.0519 GB/s
        return f"{_digits(gbps * 1e3)} MB/s"
    return f"{_digits(gbps)} GB/s"


def _digits(v: float) -> str:
    """Three significant digits, without an exponent (1234 s stays 1234 s)."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


_HUMAN = {"ns": duration, "bytes": size, "gbps": rate}
