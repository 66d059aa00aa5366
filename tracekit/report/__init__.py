"""The report layer: figures from analysis DataFrames (plots.py), the data each
panel needs (data.py), `run.plot.<name>()` (accessor.py) and the self-contained
HTML page (html.py). Nothing here computes an analysis; plotly is imported only
when a figure is made, so core tracekit works without the `report` extra."""
from __future__ import annotations

from ..errors import TracekitError

REPORT_EXTRA_HINT = "pip install 'tracekit[report]'"


def require_plotly():
    """plotly's graph_objects module, or a clear error naming the extra that installs it."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise TracekitError(f"plotting needs plotly, which is not installed: {REPORT_EXTRA_HINT} "
                            "(the `report` extra)") from None
    return go


def write_report(run, out_path, **kwargs):
    """Write the HTML report for run to out_path (see html.write_report)."""
    from .html import write_report as _write

    return _write(run, out_path, **kwargs)


__all__ = ["require_plotly", "write_report", "REPORT_EXTRA_HINT"]
