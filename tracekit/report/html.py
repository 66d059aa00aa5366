"""The report page: one self-contained HTML file (plotly.js inlined once, no
network needed to view it) with one section per panel of data.PANEL_DATA.

Two escaping rules keep trace strings inert: every string this module writes
into HTML goes through html.escape, and the figures' JSON comes from plotly's
to_json, which writes `<`, `>` and `/` as \\u003c, \\u003e, \\u002f so no kernel
name can close the <script> that holds it (tests/test_report_escaping.py)."""
from __future__ import annotations

import datetime as _dt
import html
import os

from ..errors import TracekitError
from . import require_plotly
from .data import PANEL_DATA

WHATIF_SOURCE = "replay.whatif (tracekit whatif): the baseline replay and each --scenario"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin: 0 0 .3em 0; }
section { border-top: 1px solid #ddd; padding: 1em 0; }
.meta td { padding: 0 1em 0 0; } .meta td:first-child { color: #666; }
.headline { font-size: 1.1em; margin: .6em 0 .2em 0; }
.source { color: #666; font-size: .85em; margin: 0 0 .5em 0; }
nav a { margin-right: 1em; }
table.findings { border-collapse: collapse; font-size: .9em; }
table.findings td, table.findings th { border-bottom: 1px solid #eee; padding: .3em .6em; text-align: left;
  vertical-align: top; }
"""


class ReportIncomplete(TracekitError):
    """The report was written, but sections of it failed (each names its error on the page)."""

    def __init__(self, path: str, failed: list[tuple[str, str]]):
        self.path, self.failed = path, failed
        super().__init__(f"{path}: written, but {len(failed)} section(s) failed: "
                         + "; ".join(f"{name}: {why}" for name, why in failed))


def build_figures(run, failed: list | None = None, device: str | None = None) -> list[tuple[str, object, str]]:
    """(panel name, figure, data source) for every panel; a panel whose data cannot be computed
    becomes a no-data figure that names the reason instead of stopping the whole report, and is
    added to `failed` as (panel, reason). device: the catalog device of a trace that does not name its GPU,
    for the panels whose data takes one (the roofline)."""
    import inspect

    from . import plots

    out = []
    for name, (data_fn, source) in PANEL_DATA.items():
        takes_device = device is not None and "device" in inspect.signature(data_fn).parameters
        try:
            fig = plots.PLOTS[name](data_fn(run, device=device) if takes_device else data_fn(run))
        except TracekitError as e:
            fig = plots.no_data_figure(name.replace("_", " "), str(e))
            _failed(failed, name, e)
        out.append((name, fig, source))
    return out


def _failed(failed: list | None, section: str, e: Exception) -> None:
    if failed is not None:
        failed.append((section, str(e)))


def whatif_figure(run, scenarios) -> tuple[str, object, str]:
    """The predicted-vs-measured panel: the baseline replay and every scenario against the measured run."""
    from replay.scenario import Scenario
    from replay.whatif import whatif

    from . import plots

    df = whatif(run, [Scenario(name="baseline replay"), *scenarios])
    df = df[df.scenario != "measured"]
    return "predicted_vs_measured", plots.predicted_vs_measured(df), WHATIF_SOURCE


def mfu_html(run, failed: list | None = None, device: str | None = None) -> str:
    """The MFU headline: model FLOPs utilization per rank (analysis mfu), its spread, device and dtype.
    An error is said in the headline and added to `failed` (as build_figures); device: as mfu's."""
    esc = html.escape
    try:
        df = run.analyze("mfu", device=device)
    except TracekitError as e:
        _failed(failed, "mfu", e)
        return f'<p id="mfu" class="headline">MFU: not known ({esc(str(e))})</p>'
    if df.empty:
        return '<p id="mfu" class="headline">MFU: not known (no steps or spans to divide FLOPs by)</p>'
    tflops = df.achieved_tflops.astype("float64")
    achieved = f"{tflops.min():.3g}" + (f"-{tflops.max():.3g}" if tflops.max() > tflops.min() else "")
    f = float(df.flops.median())
    flops = f"{f / 1e12:,.3g} TFLOP per step" if f >= 1e12 else f"{f / 1e9:,.3g} GFLOP per step"
    known = df[df.mfu_pct.notna()]
    if known.empty:
        note = df.attrs.get("note") or "no device peak"
        why = note.split(";")[0] + ("; name the GPU with --device NAME" if "--device NAME" in note else "")
        return (f'<p id="mfu" class="headline"><b>MFU: not known</b> ({esc(why)}); {esc(flops)}, '
                f'{esc(achieved)} TFLOP/s achieved</p>')
    lo, hi = known.mfu_pct.min(), known.mfu_pct.max()
    pct = f"{lo:.1f}%" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}%"
    devs = ", ".join(sorted({f"{d} {t} peak {p:.4g} TFLOP/s" for d, t, p in
                             zip(known.device, known.dtype, known.peak_tflops)}))
    return (f'<p id="mfu" class="headline"><b>MFU {esc(pct)}</b> over {len(known)} of {len(df)} rank(s) '
            f'({esc(achieved)} TFLOP/s achieved of {esc(devs)}; {esc(flops)}, median step)</p>'
            '<p class="source">from analysis mfu: model FLOPs of the leaf operators with recorded shapes per step / '
            'step time / the device catalog\'s dense peak</p>')


def findings_html(run, failed: list | None = None, device: str | None = None) -> str:
    """The Findings section: doctor's findings (tracekit/advice), most predicted saving first. An error is
    said in the section and added to `failed` (as build_figures); device: as doctor's."""
    from ..advice import doctor

    esc = html.escape
    try:
        found = doctor(run, device=device)
    except TracekitError as e:
        _failed(failed, "findings", e)
        return f'<section id="findings"><h2>Findings</h2><p>failed: {esc(str(e))}</p></section>'
    rows = []
    for f in found:
        saving = "not predicted" if f["saving_pct"] is None else f"{f['saving_ns'] / 1e6:.1f} ms ({f['saving_pct']:.1f}%)"
        evidence = "<br>".join(f"{esc(e['analysis'])}: {esc(e['figure'])}" for e in f["evidence"])
        rows.append(f'<tr data-kind="{esc(f["kind"])}"><td>{esc(f["kind"])}</td>'
                    f'<td>{"" if f["rank"] is None else f["rank"]}</td><td>{esc(f["title"])}</td><td>{esc(saving)}</td>'
                    f'<td>{esc(f["fix"])}</td><td class="source">{evidence}</td></tr>')
    body = ('<table class="findings"><tr><th>kind</th><th>rank</th><th>finding</th><th>predicted saving</th>'
            '<th>fix</th><th>evidence</th></tr>' + "".join(rows) + "</table>") if rows else \
        "<p>no findings: nothing the analyses show slows this job by 5% of a step or more</p>"
    return (f'<section id="findings"><h2>Findings</h2><p class="source">from tracekit doctor: the analyses\' '
            f'evidence, the replay\'s predicted saving</p>{body}</section>')


def render_html(run, *, title: str | None = None, scenarios=(), failed: list | None = None,
                device: str | None = None) -> str:
    """The whole report page as a string (with a predicted-vs-measured panel when scenarios are given).
    failed: a list that gets (section, error) for every section that could not be computed. device: the
    catalog device of a trace that does not name its GPU (MFU, roofline, findings)."""
    require_plotly()
    import plotly.io as pio

    from .plots import is_no_data

    figures = build_figures(run, failed, device)
    if scenarios:
        figures.append(whatif_figure(run, scenarios))
    title = title or f"tracekit report: {os.path.basename(os.path.normpath(run.trace_dir or run.store.path))}"
    esc = html.escape
    meta_rows = [("trace directory", run.trace_dir or ""), ("store", run.store.path),
                 ("ranks", ", ".join(str(r) for r in run.ranks)),
                 ("generated", _dt.datetime.now().isoformat(timespec="seconds"))]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title>", f"<style>{_CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>", '<table class="meta">']
    parts += [f"<tr><td>{esc(k)}</td><td>{esc(str(v))}</td></tr>" for k, v in meta_rows]
    parts.append("</table><nav>")
    parts += [f'<a href="#panel-{esc(n)}">{esc(n.replace("_", " "))}</a>' for n, _, _ in figures]
    parts.append("</nav>")
    parts.append(mfu_html(run, failed, device))
    parts.append(findings_html(run, failed, device))
    for i, (name, fig, source) in enumerate(figures):
        # The first figure carries the whole plotly.js bundle inline; the rest reuse it.
        div = pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), include_mathjax=False,
                          div_id=f"plot-{name}", config={"displaylogo": False, "responsive": True})
        empty = "true" if is_no_data(fig) else "false"
        parts.append(f'<section id="panel-{esc(name)}" data-panel="{esc(name)}" data-empty="{empty}">'
                     f'<p class="source">from {esc(source)}</p>{div}</section>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run, out_path, *, title: str | None = None, scenarios=(), device: str | None = None) -> str:
    """Write the report for run to out_path; returns the path written. scenarios (files or
    replay.scenario.Scenario objects) add the predicted-vs-measured panel; device: as render_html's. When a section failed, the page
    is written (saying so in that section) and ReportIncomplete names the sections and their errors."""
    from replay.scenario import Scenario, load_scenario

    scenarios = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    failed: list[tuple[str, str]] = []
    page = render_html(run, title=title, scenarios=scenarios, failed=failed, device=device)
    out_path = os.fspath(out_path)
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise TracekitError(f"-o {out_path}: directory {parent} does not exist")
    tmp = out_path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out_path)
    except OSError as e:
        raise TracekitError(f"-o {out_path}: cannot write: {e.strerror}") from None
    if failed:
        raise ReportIncomplete(out_path, failed)
    return out_path
