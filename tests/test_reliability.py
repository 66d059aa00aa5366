"""Issue 10 lines not covered elsewhere: truncation salvage on a real trace (>= 99%), extensions refused
by the query sandbox, a store never mixed by two writers with different content, and no network use."""
from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.errors import TracekitError

from .conftest import REPO, SHARED_TRACES, has_shared_trace, tiny_events, write_trace

SAMPLE = REPO / "sample_traces" / "ddp2_2hosts_100mbit"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_truncated_real_trace_keeps_99pct_of_complete_events(tmp_path):
    """A real trace cut at seeded random offsets (a profiler killed mid-write): every cut ingests, keeps at
    least 99% of the events that were complete before the cut (counted independently with the stdlib json
    decoder) and reports lost events. bench/truncation.py runs 20 cuts on a 53 MB trace."""
    trunc = _bench("truncation")
    rel = "hta/critical_path/simple_add"
    src = min((SHARED_TRACES / rel).glob("*.json.gz")) if has_shared_trace(rel) else SAMPLE / "rank0.trace.json.gz"
    text = gzip.decompress(src.read_bytes())
    total = len(trunc.event_end_offsets(text))
    assert total > 1000
    rows = trunc.measure(text, trunc.seeded_cuts(text, 4, "ci"), tmp_path)
    for r in rows:
        assert r["error"] == "", r
        assert r["recovered"] <= r["complete_before_cut"], r  # never invents events
        ends = trunc.event_end_offsets(text)
        prev_end = ends[r["complete_before_cut"] - 1] if r["complete_before_cut"] else 0
        mid_event = text[prev_end:r["cut"]].strip(b" \t\r\n,") != b""
        assert (r["reported_lost"] >= 1) == mid_event, r  # a cut inside an event reports it lost
    assert trunc.recovery(rows) >= 99.0, rows


def test_extensions_cannot_be_installed_or_loaded(tiny_dir, tmp_path):
    run = tracekit.open(str(tiny_dir), store=str(tmp_path / "s"))
    for sql in ("INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL httpfs FROM core",
                "SET autoinstall_known_extensions = true", "SET allowed_paths = ['/etc/passwd']",
                "SELECT * FROM read_csv('https://example.com/x.csv')", "ATTACH '/tmp/tk_other.db' AS o",
                "SELECT * FROM read_text('/etc/passwd')"):
        with pytest.raises(TracekitError):
            run.sql(sql)
    assert not os.path.exists("/tmp/tk_other.db")
    # the CLI too, and writing a file through SQL
    target = tmp_path / "leak.csv"
    for sql in ("LOAD httpfs", f"COPY (SELECT 1) TO '{target}'"):
        r = CliRunner().invoke(cli, ["query", str(tiny_dir), sql, "--store", str(tmp_path / "s")])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert not target.exists()


_WRITER = textwrap.dedent("""
    import sys
    from tracekit.errors import StoreError
    from tracekit.ingest import ingest
    try:
        ingest(sys.argv[1], sys.argv[2], jobs=1, force=True, progress=False)
    except StoreError as e:  # waited for the other writer, then gave up: a clean failure
        print(e); sys.exit(3)
""")


@pytest.mark.slow  # network namespaces or many concurrent ingests
def test_two_writers_with_different_content_never_mix(tmp_path):
    """Two processes ingest *different* directories into one store path at the same time: the result is
    exactly one of the two uninterrupted stores, never rows of both."""
    kill9 = _bench("kill9")
    dirs = []
    for k, (n, t0) in enumerate(((3, 1000.0), (5, 9000.0))):
        d = tmp_path / f"run{k}"
        for r in range(2):
            write_trace(d / f"rank{r}.json.gz", tiny_events(n * 40, t0_us=t0 + r), rank=r, world_size=2)
        dirs.append(d)
        from tracekit.ingest import ingest
        ingest(str(d), str(tmp_path / f"ref{k}"), progress=False)
    refs = [kill9.store_dump(tmp_path / f"ref{k}") for k in range(2)]
    assert refs[0] != refs[1]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for trial in range(2):
        store = tmp_path / f"s{trial}"
        order = dirs if trial == 0 else dirs[::-1]
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(d), str(store)], env=env) for d in order]
        rcs = [p.wait(180) for p in procs]
        assert all(rc in (0, 3) for rc in rcs) and 0 in rcs, rcs
        assert kill9.store_dump(store) in refs
        assert not (store / "staging").exists()


def _netns_prefix() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root (unshare -n)")
    if not shutil.which("unshare"):
        pytest.skip("unshare not installed")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n refused here: {probe.stderr.decode().strip()[:200]}")
    return ["unshare", "-n"]


@pytest.mark.slow  # network namespaces or many concurrent ingests
def test_cli_runs_without_network(tmp_path):
    """ingest, info, analyze, comms, report in a network namespace whose only interface (lo) is down."""
    prefix = _netns_prefix()
    out = subprocess.run(prefix + ["cat", "/proc/net/dev"], capture_output=True, text=True).stdout
    assert [ln.split(":")[0].strip() for ln in out.splitlines()[2:]] == ["lo"]
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=shutil.ignore_patterns(".tracekit"))
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(tmp_path), NO_PROXY="*")
    tk = [sys.executable, "-c", "import sys; from tracekit.cli import main; sys.argv[0] = 'tracekit'; main()"]
    cmds = [["ingest", str(d)], ["info", str(d)], ["analyze", "temporal_breakdown", str(d)],
            ["comms", "collectives", str(d)]]
    if (REPO / "tracekit" / "cli" / "report.py").exists():
        cmds.append(["report", str(d), "-o", str(tmp_path / "r.html")])
    for c in cmds:
        r = subprocess.run(prefix + tk + c, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (c, r.stdout[-2000:], r.stderr[-2000:])
    if len(cmds) == 5:
        assert (tmp_path / "r.html").stat().st_size > 0


_NO_SOCKETS = textwrap.dedent("""
    import sys
    def hook(event, args):
        if event.startswith("socket.") and event != "socket.__new__" or event == "socket.__new__" and args[1] != 1:
            raise RuntimeError(f"network use: {event} {args!r}")
    sys.addaudithook(hook)
    import tracekit
    from tracekit.ingest import ingest
    ingest(sys.argv[1], jobs=2, progress=False)
    run = tracekit.open(sys.argv[1])
    run.info()
    run.sql("SELECT count(*) FROM kernels")
    print("ok")
""")


@pytest.mark.slow  # network namespaces or many concurrent ingests
def test_library_path_opens_no_inet_socket(tmp_path):
    """In-process: an audit hook refuses any socket call but AF_UNIX creation; ingest, open, SQL still work."""
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d, ignore=shutil.ignore_patterns(".tracekit"))
    r = subprocess.run([sys.executable, "-c", _NO_SOCKETS, str(d)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
