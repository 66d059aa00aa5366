"""The scenario documents doctor writes, as TOML (tables of scalars and one level of inline tables: all
its scenarios need; the standard library reads TOML but does not write it)."""
from __future__ import annotations


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _key(k) -> str:
    k = str(k)
    return k if k.replace("_", "").replace("-", "").isalnum() and not k.isdigit() else _value(k)


def dumps(doc: dict, comment: str = "") -> str:
    """A scenario document {table: {key: value}} as TOML text."""
    lines = [f"# {comment}"] if comment else []
    for table, body in doc.items():
        lines.append(f"[{table}]")
        lines += [f"{_key(k)} = {_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"
