"""Hostile names from a trace (kernel names with <, >, quotes, <script>) stay text:
the page adds no <script> for them, plotly's JSON cannot be closed early, and in
Chromium no injected code runs while the names are shown as written."""
from __future__ import annotations

import re

import pytest

from tests.conftest import tiny_events, write_trace
from tests.test_report import Browser, build_report, check_rendered

pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")

HOSTILE = [
    "<script>window.__pwned='script'</script>",
    "</script><script>window.__pwned='breakout'</script>",
    "<img src=x onerror=\"window.__pwned='img'\">",
    "void k<float, \"4\">('x')",
]


def hostile_trace(tmp_path):
    d = tmp_path / "hostile"
    for rank in (0, 1):
        events = tiny_events(n_steps=len(HOSTILE))
        kernels = [e for e in events if e.get("cat") == "kernel"]
        for e, name in zip(kernels, HOSTILE):
            e["name"] = name
        write_trace(d / f"rank{rank}.trace.json", events, rank=rank, world_size=2)
    return d


@pytest.mark.slow  # builds two HTML reports
def test_hostile_kernel_names_do_not_run(tmp_path):
    page = build_report(hostile_trace(tmp_path), tmp_path, "hostile",
                        "--title", "</title><script>window.__pwned='title'</script>")
    text = page.read_text(encoding="utf-8")
    plain = tmp_path / "plain"
    for rank in (0, 1):
        write_trace(plain / f"rank{rank}.trace.json", tiny_events(n_steps=len(HOSTILE)), rank=rank, world_size=2)
    clean = build_report(plain, tmp_path, "plain")
    # The hostile names and title add no script element: as many <script openings as the same
    # trace with plain names.
    assert len(re.findall(r"<script", text)) == len(re.findall(r"<script", clean.read_text(encoding="utf-8")))
    assert "window.__pwned" in text  # the names are in the page (as escaped data) ...
    assert "<script>window.__pwned" not in text  # ... but never as markup
    assert "</script><script>window" not in text
    assert "<img src=x" not in text

    browser = Browser(tmp_path)
    try:
        state = check_rendered(browser, page, tmp_path / "hostile.png")
    finally:
        browser.close()
    assert state["pwned"] is None
    assert state["title"] == "</title><script>window.__pwned='title'</script>"
    kernels = next(p for p in state["panels"] if p["name"] == "top_kernels")
    assert not kernels["empty"]
    for name in HOSTILE:  # drawn as the trace spells them, not interpreted
        assert name in kernels["text"], name


def test_plotly_json_escapes_script_close():
    import plotly.graph_objects as go
    import plotly.io as pio

    fig = go.Figure(go.Bar(x=["</script><script>alert(1)</script>"], y=[1]))
    div = pio.to_html(fig, full_html=False, include_plotlyjs=False)
    assert "</script><script>alert(1)" not in div
    assert div.count("</script>") == 1  # only plotly's own closing tag
