"""The HTML report: built from real traces, opened in headless Chromium over the
DevTools protocol (console errors, every plot drawn, no network), screenshotted;
plus the CLI's errors and the plot functions' no-data panels."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli

pytest.importorskip("plotly", reason="the report needs the `report` extra (plotly)")

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Per panel: what the page must show once plotly has drawn it (JSON, read by the test).
_INSPECT_JS = """
JSON.stringify({
  pwned: window.__pwned === undefined ? null : window.__pwned,
  title: document.title,
  panels: Array.from(document.querySelectorAll('section[data-panel]')).map(s => {
    const svg = s.querySelector('svg.main-svg');
    const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    return {name: s.dataset.panel, empty: s.dataset.empty === 'true',
            svgs: s.querySelectorAll('svg.main-svg').length, width: r.width, height: r.height,
            marks: s.querySelectorAll('g.trace path, g.trace image, g.hm image, g.points path').length,
            text: s.textContent};
  })
})
"""


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")


class Browser:
    """Headless Chromium driven over the DevTools protocol: one page, its console errors,
    exceptions and network requests recorded."""

    def __init__(self, tmp_path: Path):
        websocket = pytest.importorskip("websocket", reason="websocket-client drives Chromium's DevTools protocol")
        profile = tmp_path / "chromium-profile"
        profile.mkdir()
        self.proc = subprocess.Popen(
            [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        pages = []
        while not pages:
            pages = [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
                     if t["type"] == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self._id = 0
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        self._events: list[dict] = []
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable")

    def _record(self, msg: dict) -> None:
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.console_errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.console_errors.append(p["entry"]["text"])
        elif m == "Network.requestWillBeSent":
            self.requests.append(p["request"]["url"])
        self._events.append(msg)

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self._record(msg)

    def open(self, path: Path, timeout_s: float = 30) -> None:
        self._events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading")
            self._record(json.loads(self.ws.recv()))

    def evaluate(self, js: str):
        r = self.call("Runtime.evaluate", expression=js, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    def inspect(self, timeout_s: float = 20) -> dict:
        """The page's panels once every one has drawn its SVG (plotly draws after load)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = json.loads(self.evaluate(_INSPECT_JS))
            if all(p["svgs"] > 0 for p in state["panels"]) or time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def screenshot(self, path: Path) -> Path:
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=min(height, 16000),
                  deviceScaleFactor=1, mobile=False)
        time.sleep(0.5)  # plotly's responsive relayout after the resize
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - closing after a failed start
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path)
    yield b
    b.close()


def build_report(trace_dir, tmp_path: Path, name: str, *extra) -> Path:
    out = tmp_path / f"{name}.html"
    r = CliRunner().invoke(cli, ["report", str(trace_dir), "--store", str(tmp_path / f"{name}.store"),
                                 "-o", str(out), *extra])
    assert r.exit_code == 0, r.output
    return out


def check_rendered(browser: Browser, page: Path, shot: Path) -> dict:
    browser.open(page)
    state = browser.inspect()
    browser.screenshot(shot)
    assert browser.console_errors == []
    # Offline: nothing but the file itself (and data: URIs plotly makes) was requested.
    assert [u for u in browser.requests if not u.startswith(("file:", "data:", "blob:"))] == []
    assert [p["name"] for p in state["panels"]] == list(tracekit.report.data.PANEL_DATA)
    for p in state["panels"]:
        assert p["svgs"] > 0 and p["width"] > 100 and p["height"] > 100, p["name"]
        if p["empty"]:
            assert "no data:" in p["text"], p["name"]
        else:
            assert p["marks"] > 0, f"{p['name']}: plotly drew no marks"
    assert state["pwned"] is None
    return state


@pytest.mark.slow  # renders the report in chromium
def test_report_renders_in_chromium_gloo_sample(tmp_path, browser):
    page = build_report(REPO / "sample_traces" / "ddp4_loopback", tmp_path, "ddp4")
    assert page.stat().st_size > 1_000_000  # plotly.js is inlined, not fetched
    state = check_rendered(browser, page, tmp_path / "ddp4.png")
    by_name = {p["name"]: p for p in state["panels"]}
    # A CPU-only gloo run: collectives and steps have data, kernels and memory do not.
    for name in ("step_time", "temporal_breakdown", "comm_comp_overlap", "collective_skew", "busbw_vs_size",
                 "straggler_ranking"):
        assert not by_name[name]["empty"], name
    assert by_name["top_kernels"]["empty"] and "no GPU kernels" in by_name["top_kernels"]["text"]
    assert by_name["memory_timeline"]["empty"] and by_name["memory_categories"]["empty"]


@pytest.mark.slow  # renders the report in chromium
def test_report_renders_in_chromium_nccl_trace(tmp_path, browser, shared):
    page = build_report(shared("astra-sim/megatron_tp8"), tmp_path, "megatron")
    state = check_rendered(browser, page, tmp_path / "megatron.png")
    by_name = {p["name"]: p for p in state["panels"]}
    assert not by_name["top_kernels"]["empty"] and "nccl" in by_name["top_kernels"]["text"].lower()
    assert not by_name["collective_skew"]["empty"]
    assert not by_name["roofline"]["empty"] and "A100-SXM4-80GB fp16 roof" in by_name["roofline"]["text"]
    assert "MFU 9.4-10.0%" in page.read_text()


@pytest.mark.slow  # renders the report in chromium
def test_report_with_scenarios_has_predicted_vs_measured(tmp_path, browser):
    fast = tmp_path / "links4x.toml"
    fast.write_text("[network]\nbandwidth_scale = 4.0\n")
    page = build_report(REPO / "sample_traces" / "ddp2_2hosts_100mbit", tmp_path, "whatif", "--scenario", str(fast))
    browser.open(page)
    state = browser.inspect()
    assert browser.console_errors == [] and state["pwned"] is None
    panels = {p["name"]: p for p in state["panels"]}
    assert list(panels) == [*tracekit.report.data.PANEL_DATA, "predicted_vs_measured"]
    pvm = panels["predicted_vs_measured"]
    assert not pvm["empty"] and pvm["marks"] > 0
    # the baseline replay reproduces the run, links 4x faster cuts the step by more than half
    assert "baseline replay" in pvm["text"] and "links4x" in pvm["text"] and "+0.0%" in pvm["text"]


def test_report_bad_scenario_is_one_line_exit_2(tmp_path):
    scenario = tmp_path / "faster_net.toml"
    scenario.write_text("[network]\nbandwidth_gbps = 400\n")
    r = CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / "ddp3_slow_rank1"),
                                 "--scenario", str(scenario), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 2
    assert "[network] bandwidth_gbps" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_report_bad_output_dir_is_one_line_exit_2(tmp_path):
    r = CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / "ddp3_slow_rank1"),
                                 "--store", str(tmp_path / "s"), "-o", str(tmp_path / "missing" / "r.html")])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "-o" in r.output and "does not exist" in r.output


def test_report_help_has_example():
    r = CliRunner().invoke(cli, ["report", "--help"])
    assert r.exit_code == 0 and "Example:" in r.output and "tracekit report runs/job42/" in r.output


def test_plots_without_data_are_no_data_panels():
    import pandas as pd

    from tracekit.report import plots

    for name, fn in plots.PLOTS.items():
        fig = fn(pd.DataFrame())
        assert plots.is_no_data(fig), name
        assert fig.layout.annotations[0].text.startswith("no data:"), name


def test_run_plot_returns_figures(tmp_path):
    import plotly.graph_objects as go

    from tracekit.report import plots

    with tracekit.open(REPO / "sample_traces" / "ddp3_slow_rank1", store=tmp_path / "s") as run:
        assert set(run.plot.names()) == set(plots.PLOTS)
        fig = run.plot.straggler_ranking()
        assert isinstance(fig, go.Figure) and not plots.is_no_data(fig)
        # ddp3_slow_rank1: rank 1 is the slow one, so it causes the most waiting (last bar = top).
        assert fig.data[0].y[-1] == "rank 1"
        assert plots.is_no_data(run.plot.top_kernels())  # gloo: no GPU kernels


def test_report_opens_with_doctors_findings(tmp_path):
    # the Findings section comes before every panel and holds doctor's findings, most saving first
    from tracekit.advice import doctor
    from tracekit.report.html import render_html

    with tracekit.open(str(REPO / "sample_traces" / "ddp3_slow_rank1"), store=str(tmp_path / "st")) as run:
        page = render_html(run)
        kinds = [f["kind"] for f in doctor(run)]
    assert page.index('<section id="findings">') < page.index("data-panel=")
    section = page[page.index('<section id="findings">'):page.index("</section>", page.index('<section id="findings">'))]
    assert [k for k in kinds] == [part.split('"')[0] for part in section.split('data-kind="')[1:]]
    assert kinds[0] == "straggler" and "not predicted" in section


def test_report_mfu_headline_is_the_mfu_analysis(tmp_path):
    # a GPU rank with a known peak: the headline states the analysis's MFU, device and peak; a CPU run says why not
    from tracekit.report.html import mfu_html

    from .test_hardware import _trace

    with tracekit.open(str(_trace(tmp_path / "gpu")), store=str(tmp_path / "st")) as run:
        m = run.analyze("mfu").iloc[0]
        head = mfu_html(run)
    assert f"<b>MFU {m.mfu_pct:.1f}%</b> over 1 of 1 rank(s)" in head
    assert f"A100-SXM4-80GB {m['dtype']} peak {m.peak_tflops:.4g} TFLOP/s" in head
    with tracekit.open(str(REPO / "sample_traces" / "ddp3_slow_rank1"), store=str(tmp_path / "cpu")) as run:
        head = mfu_html(run)
    assert "<b>MFU: not known</b> (rank 0: no GPU device in the trace (a CPU run)" in head and "FLOP per step" in head


def test_roofline_plot_draws_each_device_roof_and_its_ops():
    import pandas as pd

    from tracekit.report import plots

    df = pd.DataFrame([{"rank": 0, "op_class": "gemm", "intensity_flop_per_byte": 400.0, "achieved_tflops": 200.0,
                        "share_pct": 64.1, "device": "A100-SXM4-80GB", "dtype": "bf16", "peak_tflops": 312.0,
                        "memory_gbps": 2039.0},
                       {"rank": 0, "op_class": "elementwise", "intensity_flop_per_byte": 0.0, "achieved_tflops": 0.0,
                        "share_pct": 60.0, "device": "A100-SXM4-80GB", "dtype": "bf16", "peak_tflops": 312.0,
                        "memory_gbps": 2039.0}])
    fig = plots.roofline(df)
    roof, gemm = fig.data
    assert list(roof.x) == [40.0, 312.0 * 1e3 / 2039.0, 4000.0]  # the ridge point between the two roofs
    assert list(roof.y) == [40.0 * 2039.0 / 1e3, 312.0, 312.0]
    assert gemm.name == "gemm" and list(gemm.y) == [200.0]  # the FLOP-less op is not drawn on log axes
