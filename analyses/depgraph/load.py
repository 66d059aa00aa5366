"""Loading a run's ranks for the graph: the selected ranks, and their CPU ops, runtime calls, GPU ops,
sync records, steps, hosts and collective participants as DataFrames."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tracekit.errors import TracekitError

from .._sql import query
from ..comms import comm_participants


@dataclass
class Loaded:
    """What the graph is built from, one DataFrame per source (measured times, ns)."""

    cpu: pd.DataFrame  # rank, pid, tid, event_id, cat, name, ts_ns, dur_ns, correlation
    gpu: pd.DataFrame  # rank, pid, tid, event_id, name, ts_ns, dur_ns, correlation
    cuda_sync: pd.DataFrame  # rank, correlation, name, stream, wait_on_stream
    steps: pd.DataFrame  # rank, step, pid, tid, ts_ns, end_ns, is_last
    hosts: pd.DataFrame  # rank, hostname
    comm: pd.DataFrame  # collective participants (analyses/comm_participants.sql)


def select_ranks(run, ranks=None, all_ranks=None) -> list[int]:
    """The ranks to build the graph of, sorted (default: all of the store's; all_ranks: the store's, when read)."""
    if all_ranks is None:
        all_ranks = [int(r) for r in run.sql("SELECT rank FROM ranks ORDER BY rank")["rank"]]
    if not all_ranks:
        raise TracekitError(f"{run.store.path}: the store has no ranks to replay")
    if ranks is None:
        return all_ranks
    ranks = sorted({int(r) for r in ranks})
    missing = [r for r in ranks if r not in all_ranks]
    if missing:
        raise TracekitError(f"--ranks: rank(s) {', '.join(map(str, missing))} not in the store "
                            f"(it has ranks {_span(all_ranks)})")
    return ranks


def _span(ranks) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 3 else ", ".join(map(str, ranks))


def load(run, ranks, *, comm: pd.DataFrame | None = None, steps: pd.DataFrame | None = None,
         hosts: pd.DataFrame | None = None) -> Loaded:
    """comm, steps, hosts: when already read (depgraph.run_wide's)."""
    return Loaded(cpu=_async_annotations_out(query(run, "_graph_cpu", ranks=ranks)),
                  gpu=query(run, "_graph_gpu", ranks=ranks), cuda_sync=query(run, "_graph_cuda_sync", ranks=ranks),
                  steps=query(run, "_graph_steps", ranks=ranks) if steps is None else steps,
                  hosts=_hosts(run) if hosts is None else hosts,
                  comm=comm_participants(run, ranks) if comm is None else comm.reset_index(drop=True))


def _hosts(run) -> pd.DataFrame:
    """rank -> host. Testbed namespaces share the machine's hostname, so run.json's per-rank `host`
    label, when there is one, names the host a rank ran on."""
    hosts = run.sql("SELECT rank, hostname FROM ranks ORDER BY rank")
    label = {int(r["rank"]): r["host"] for r in run.run_manifest().get("ranks") or []
             if isinstance(r, dict) and r.get("host") is not None and r.get("rank") is not None}
    if label:
        hosts["hostname"] = [label.get(int(r), h) for r, h in zip(hosts["rank"], hosts.hostname)]
    return hosts


def _async_annotations_out(cpu: pd.DataFrame) -> pd.DataFrame:
    """gloo's send and recv run on the caller's thread, and their gloo:* annotation opens inside the c10d
    call but closes when the message has gone (or come), while the thread runs on: an async span, not work
    of that thread, which would cut the thread's later ops (and the call, the collective's participant) into
    pieces. Such an annotation (one that outlasts the call it opened in) is left out; its end is the
    collective's completion on that rank (comm_participants' nested_end_ns)."""
    if cpu.empty:
        return cpu
    ann = cpu[(cpu.cat == "user_annotation") & cpu.name.str.startswith("gloo:")]
    if ann.empty:
        return cpu
    calls = cpu[(cpu.cat == "cpu_op") & cpu.name.str.startswith("c10d::")]
    calls = calls.assign(call_end=calls.ts_ns + calls.dur_ns)[["rank", "pid", "tid", "ts_ns", "call_end"]]
    a = ann[["rank", "pid", "tid", "ts_ns", "dur_ns"]].reset_index()
    opened_in = pd.merge_asof(a.sort_values("ts_ns"), calls.sort_values("ts_ns"), on="ts_ns",
                              by=["rank", "pid", "tid"], direction="backward")
    outlast = opened_in.call_end.notna() & (opened_in.ts_ns + opened_in.dur_ns > opened_in.call_end)
    return cpu.drop(index=opened_in.loc[outlast, "index"].to_numpy())
