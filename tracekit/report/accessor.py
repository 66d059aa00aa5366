"""`run.plot.<name>()`: compute a panel's DataFrame on the run and return its
figure. The accessor only wires data.py to plots.py; neither side knows about it."""
from __future__ import annotations

from .data import PANEL_DATA


class PlotAccessor:
    """Figures for one run: run.plot.step_time(), run.plot.top_kernels(), ... (see plots.PLOTS)."""

    def __init__(self, run):
        self._run = run

    def names(self) -> list[str]:
        return list(PANEL_DATA)

    def __dir__(self):
        return [*super().__dir__(), *PANEL_DATA]

    def __repr__(self) -> str:
        return f"<tracekit plots: {', '.join(PANEL_DATA)}>"


def _method(name: str):
    def plot(self):
        from . import plots

        data_fn, _ = PANEL_DATA[name]
        return plots.PLOTS[name](data_fn(self._run))

    plot.__name__ = name
    plot.__doc__ = f"Figure of {PANEL_DATA[name][1]} for this run (tracekit.report.plots.{name})."
    return plot


for _name in PANEL_DATA:
    setattr(PlotAccessor, _name, _method(_name))
