"""CLI: every command through click's CliRunner, including the error paths."""
from __future__ import annotations

import gzip
import json
import re
import subprocess

import click
import pytest
from click.testing import CliRunner

from tracekit import __version__
from tracekit.cli import cli

from .conftest import REPO, tiny_events, write_trace


@pytest.fixture
def runner():
    return CliRunner()


def _all_commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def test_every_command_has_help_with_an_example(runner):
    for path, cmd in _all_commands(cli):
        r = runner.invoke(cli, [*path, "--help"])
        assert r.exit_code == 0, path
        assert cmd.help and "Example" in r.output, f"tracekit {' '.join(path)} --help has no example"


def test_version(runner):
    r = runner.invoke(cli, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_ingest_info_query(runner, tiny_dir, tmp_path):
    store = str(tmp_path / "s")
    r = runner.invoke(cli, ["ingest", str(tiny_dir), "--store", store])
    assert r.exit_code == 0, r.output
    assert "ingested 2 file(s), 0 unchanged" in r.output
    r = runner.invoke(cli, ["ingest", str(tiny_dir), "--store", store])
    assert "ingested 0 file(s), 2 unchanged" in r.output
    r = runner.invoke(cli, ["info", str(tiny_dir), "--store", store])
    assert r.exit_code == 0, r.output
    assert "ranks:      0-1 (2 of world size 2)" in r.output
    assert "steps:      2 a rank (ProfilerStep#N annotations; replay's median step leaves out each rank's last" \
        in r.output
    r = runner.invoke(cli, ["info", str(tiny_dir), "--store", store, "--format", "json"])
    info = json.loads(r.output)
    assert info["ranks"] == [0, 1] and info["world_size"] == 2 and info["per_rank"][0]["kernels"] == 2
    q = "SELECT rank, count(*) AS n FROM kernels GROUP BY rank ORDER BY rank"
    r = runner.invoke(cli, ["query", str(tiny_dir), q, "--store", store, "--format", "json"])
    assert json.loads(r.output) == [{"rank": 0, "n": 2}, {"rank": 1, "n": 2}]
    r = runner.invoke(cli, ["query", str(tiny_dir), q, "--store", store, "--format", "csv"])
    assert r.output.splitlines() == ["rank,n", "0,2", "1,2"]
    r = runner.invoke(cli, ["query", str(tiny_dir), q, "--store", store])
    assert r.output.splitlines()[0].split() == ["rank", "n"] and r.output.splitlines()[2].split() == ["0", "2"]


def test_default_store_inside_trace_dir(runner, tiny_dir):
    r = runner.invoke(cli, ["query", str(tiny_dir), "SELECT count(*) AS n FROM ranks", "--format", "csv"])
    assert r.exit_code == 0 and r.output.splitlines() == ["n", "2"]
    assert (tiny_dir / ".tracekit" / "manifest.json").exists()


def _bad(runner, tmp_path, name: str, content: bytes, *extra):
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(content)
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s"), *extra])
    return r


@pytest.mark.parametrize("name,content,message", [
    ("rank0.json", b"hello, not json", "not JSON"),
    ("rank0.json.gz", b"\x1f\x8b\x08\x00garbage-garbage-garbage", "gzip data is corrupt"),
    ("rank0.json", b'{"traceEvents": []}', "traceEvents is empty"),
    ("rank0.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": "x"}]}', "rank0.json"),
    ("rank0.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}', 'traceEvents[0]: Failed to cast value to numerical: "soon"'),
    ("rank0.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}', "numeric 'ts' and 'dur'"),
    ("rank0.json", b'{"traceEvents": [1, 2, 3]}', "rank0.json"),
    ("rank0.json", b"", "empty"),
    ("rank0.json", b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}', None),  # truncated: salvaged
])
def test_bad_input_one_clear_line_exit_2(runner, tmp_path, name, content, message):
    r = _bad(runner, tmp_path, name, content)
    if message is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert name in r.output and message in r.output
    assert len([line for line in r.output.splitlines() if line.strip()]) == 1


def test_gzip_crc_error(runner, tmp_path):
    blob = bytearray(gzip.compress(json.dumps({"traceEvents": tiny_events(1)}).encode()))
    blob[-8] ^= 0xFF  # the CRC32 of the trailer
    r = _bad(runner, tmp_path, "rank0.json.gz", bytes(blob))
    assert r.exit_code == 2 and "gzip data is corrupt" in r.output and "rank0.json.gz" in r.output


def test_directory_without_traces(runner, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "run.json").write_text('{"world_size": 2}')
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "no Kineto traces found" in r.output and "run.json" in r.output
    r = runner.invoke(cli, ["ingest", str(tmp_path / "missing")])
    assert r.exit_code == 2


def test_rank_errors_name_the_option(runner, tmp_path):
    d = tmp_path / "t"
    write_trace(d / "trace.json", tiny_events(1), rank=None)
    write_trace(d / "other.json", tiny_events(1), rank=None)
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "--rank-from" in r.output and ("trace.json" in r.output or "other.json" in r.output)
    (d / "other.json").unlink()
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s"), "--rank-from", "sideways"])
    assert r.exit_code == 2 and "--rank-from" in r.output
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s"), "--rank-from", r"regex:trace()"])
    assert r.exit_code == 2 and "regex" in r.output
    write_trace(d / "trace.json", tiny_events(1), rank=None)
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s"), "--rank-from", "order"])
    assert r.exit_code == 0, r.output


def test_lone_rankless_trace_is_rank_0_with_a_note(runner, tmp_path):
    d = tmp_path / "t"
    write_trace(d / "my_profile.json", tiny_events(1), rank=None)
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == ["note: my_profile.json: taken as rank 0: the run's only trace names no rank "
                                     "(no distributedInfo.rank, no rank<N> in its name); before adding more traces, "
                                     "rename each to rank<N>.json or pass --rank-from"]
    r = runner.invoke(cli, ["info", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 0 and "ranks:      0 (1 of world size unknown)" in r.output
    assert "note: my_profile.json: taken as rank 0" in r.output
    # asked for file names, it still has none
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s2"), "--rank-from", "filename"])
    assert r.exit_code == 2 and "my_profile.json" in r.output and "--rank-from" in r.output


def test_info_time_span_from_timed_events_only(runner, tmp_path):
    # metadata, instant and counter events with absurd timestamps (an MTIA trace's metadata sit 41 days
    # away); the timed events run from the step's start at 1000 us to its end at 1100 us
    events = tiny_events(1) + [
        {"ph": "M", "name": "process_labels", "pid": 100, "tid": 0, "ts": 0, "args": {"labels": "x"}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "marker", "pid": 100, "tid": 7, "ts": 3.6e12, "s": "t"},
        {"ph": "C", "name": "queue depth", "pid": 0, "ts": 1, "args": {"depth": 3}},
    ]
    d = tmp_path / "t"
    write_trace(d / "rank0.json", events)
    r = runner.invoke(cli, ["info", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "time span:  100 µs" in r.output.splitlines()  # human units (the output contract)
    r = runner.invoke(cli, ["info", str(d), "--store", str(tmp_path / "s"), "--format", "json"])
    out = json.loads(r.output)
    assert (out["first_ts_ns"], out["last_end_ns"]) == (1_000_000, 1_100_000)
    assert out["per_rank"][0]["span_ns"] == 100_000


def test_query_errors(runner, tiny_dir, tmp_path):
    store = str(tmp_path / "s")
    r = runner.invoke(cli, ["query", str(tiny_dir), "SELEC nonsense", "--store", store])
    assert r.exit_code == 2 and "query failed" in r.output and "Traceback" not in r.output
    r = runner.invoke(cli, ["query", str(tiny_dir), "SELECT * FROM read_text('/etc/passwd')", "--store", store])
    assert r.exit_code == 2 and "root:" not in r.output
    r = runner.invoke(cli, ["query", str(tiny_dir), "SELECT count(*) AS n FROM read_text('/etc/hostname')",
                            "--store", store, "--allow-external-access", "--format", "csv"])
    assert r.exit_code == 0 and r.output.splitlines() == ["n", "1"]


def test_truncated_trace_warns_with_count(runner, tmp_path):
    d = tmp_path / "t"
    p = write_trace(d / "rank0.json", tiny_events(3), rank=0)
    p.write_bytes(p.read_bytes()[:-400])
    r = runner.invoke(cli, ["ingest", str(d), "--store", str(tmp_path / "s")])
    assert r.exit_code == 0
    assert "warning: rank0.json: file cut short" in r.output and "lost 1 incomplete event" in r.output


def test_tables_in_human_units_csv_and_json_raw(runner, tiny_dir, tmp_path):
    q = ("SELECT 89478383::BIGINT AS step_ns, 1733140000000000000::BIGINT AS first_ts_ns, 2097152::BIGINT AS bytes, "
         "0.784::DOUBLE AS busbw_gbps, 'nan'::DOUBLE AS ratio, NULL::BIGINT AS wait_ns")
    args = ["query", str(tiny_dir), q, "--store", str(tmp_path / "s")]
    table = runner.invoke(cli, args).stdout.splitlines()
    # durations, sizes and rates for people under names without the raw unit; a point in time stays on the
    # trace's clock under its own name; the columns empty on every row (ratio, wait_ns) are left out
    assert table[0].split() == ["step", "first_ts_ns", "bytes", "busbw"]
    assert table[2].split() == ["89.5", "ms", "1733140000000000000", "2.0", "MiB", "784", "MB/s"]
    csv = runner.invoke(cli, [*args, "--format", "csv"]).stdout.splitlines()
    assert csv[0] == "step_ns,first_ts_ns,bytes,busbw_gbps,ratio,wait_ns"
    assert csv[1] == "89478383,1733140000000000000,2097152,0.784,,"
    row = json.loads(runner.invoke(cli, [*args, "--format", "json"]).stdout)[0]
    assert row == {"step_ns": 89478383, "first_ts_ns": 1733140000000000000, "bytes": 2097152, "busbw_gbps": 0.784,
                   "ratio": None, "wait_ns": None}


def test_info_formats_and_notes_on_stderr(runner, tmp_path):
    d = tmp_path / "t"
    write_trace(d / "rank0.trace.json", tiny_events(1), rank=0, world_size=2)  # 1 of 2 ranks: a note
    store = str(tmp_path / "s")
    r = runner.invoke(cli, ["info", str(d), "--store", store, "--format", "table"])
    assert r.exit_code == 0 and "note: 1 of 2 ranks present" in r.stderr and "note:" not in r.stdout
    assert json.loads(runner.invoke(cli, ["info", str(d), "--store", store, "--format", "json"]).stdout)["ranks"] == [0]
    assert runner.invoke(cli, ["info", str(d), "--store", store, "--format", "text"]).exit_code == 2


def test_table_names_without_units_only_where_they_stay_distinct():
    """tracekit.output.table: a column keeps its raw name where dropping the unit would give two columns one
    name; an empty frame names its columns as a full one does; a column empty on some rows only is kept."""
    import pandas as pd

    from tracekit.output import people_name, table

    df = pd.DataFrame({"wait_ns": [1500, 2500], "wait": ["a", "b"], "peak_bytes": [1024, None],
                       "total_bytes": [None, None]})
    lines = table(df).splitlines()
    assert lines[0].split() == ["wait_ns", "wait", "peak"]
    assert lines[2].split() == ["1.5", "µs", "a", "1.0", "KiB"] and lines[3].split() == ["2.5", "µs", "b"]
    assert table(df.head(0)).splitlines() == ["(no rows)", "wait_ns  wait  peak  total"]
    assert people_name("busbw_gbps:all_reduce") == "busbw:all_reduce"
    assert people_name("kernel_time_ns:ncclKernel_AllReduce") == "kernel_time:ncclKernel_AllReduce"
    assert people_name("first_ts_ns") == "first_ts_ns" and people_name("bytes") == "bytes"
    assert people_name("idle_pct") == "idle_pct"


@pytest.mark.slow  # replays the sample twice
def test_readme_first_query_is_ci_s_and_agrees_with_info_and_replay(runner, tmp_path):
    """The README's first command (which .ci/run runs as written) queries each rank's median step without the
    last, as replay takes it: the medians are replay's measured steps, and info and replay say what their
    step counts count."""
    first = re.search(r"```\n(pip install -e \. && tracekit info .*)\n```", (REPO / "README.md").read_text()).group(1)
    query = re.search(r'tracekit query sample_traces/ddp4_loopback "([^"]+)"', first).group(1)
    # .ci/run takes that line from the README itself: its extraction gives exactly this command
    pick = re.search(r"^first=\$\((.*)\)$", (REPO / ".ci" / "run").read_text(), re.M).group(1)
    assert subprocess.run(["bash", "-c", pick], cwd=REPO, capture_output=True, text=True).stdout.strip() == first
    sample, store = str(REPO / "sample_traces" / "ddp4_loopback"), str(tmp_path / "s")
    rows = json.loads(runner.invoke(cli, ["query", sample, query, "--store", store, "--format", "json"]).stdout)
    replayed = json.loads(runner.invoke(cli, ["replay", sample, "--store", store, "--format", "json"]).stdout)
    assert [r["rank"] for r in rows] == [r["rank"] for r in replayed["ranks"]] == [0, 1, 2, 3]
    assert [r["steps"] for r in rows] == [r["steps"] for r in replayed["ranks"]] == [2, 2, 2, 2]
    assert [round(r["median_step_ns"]) for r in rows] == [r["measured_step_ns"] for r in replayed["ranks"]]
    info = runner.invoke(cli, ["info", sample, "--store", store]).stdout
    assert "steps:      3 a rank (ProfilerStep#N annotations" in info
    table = runner.invoke(cli, ["replay", sample, "--store", store]).stdout
    assert "steps: the medians take 2 of the 3 steps replayed a rank, the last left out" in table
