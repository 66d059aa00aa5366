"""Pieces the benchmark scripts share: running a snippet in a fresh interpreter, and putting a markdown
table between markers in a docs file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_snippet(code: str, *args: str) -> dict:
    """Run code in a fresh Python (the repository importable) and return the JSON its last line prints."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_md_block(path: str, marker: str, table: str) -> None:
    """Replace the text between <!-- marker --> and <!-- /marker --> in path (append the block if absent)."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def step_ns(run) -> float:
    """A run's measured step, ns: its slowest rank's median step (the last profiled step left out)."""
    return float(run.sql("SELECT max(m) AS m FROM (SELECT rank, median(dur_ns) AS m FROM steps WHERE NOT is_last "
                         "GROUP BY rank)").m.iloc[0])


def pct(v) -> str:
    """A signed percentage for a table cell ('n/a' for None)."""
    return "n/a" if v is None else f"{v:+.1f}%"
