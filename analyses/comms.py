"""Communication across ranks: collectives per rank and matched, stragglers, bandwidth, clock offsets,
flight-recorder checks, and the collective participants the dependency graph reads (SQL in
analyses/collectives*.sql, straggler_attribution.sql, bandwidth_report.sql, comms_*.sql, clock_offsets.sql,
comm_participants.sql). Owns the private views they all read, analyses/_comm_views.sql."""
from __future__ import annotations

import json

import pandas as pd

from tracekit.errors import TracekitError
from tracekit.store.sql import statements

from ._sql import check_scope, documented_columns, named_params, query, sql_text, with_note
from .kernel_classes import COMM_KERNEL_PATTERN

_LIST_COLUMNS = ("pg_ranks", "participants", "ranks_not_traced", "ranks_missing")


def prepare_views(run, offsets: dict[int, int] | None = None) -> None:
    """Install the collectives views on run's connection (once), with per-rank clock offsets in ns added
    to every time (None: no correction beyond ranks.clock_offset_ns)."""
    run.sql("CREATE OR REPLACE TEMP TABLE _comm_clock_offsets (rank BIGINT, clock_offset_ns BIGINT)")
    if offsets:
        values = ", ".join(["(?, ?)"] * len(offsets))
        run.sql(f"INSERT INTO _comm_clock_offsets VALUES {values}",
                [v for r, o in sorted(offsets.items()) for v in (int(r), int(o))])
    if not _installed(run):
        params = {"comm_kernel_pattern": COMM_KERNEL_PATTERN}
        for stmt in statements(sql_text("_comm_views")):
            run.sql(stmt, named_params(stmt, params, "_comm_views.sql"))


def _installed(run) -> bool:
    try:
        run.sql("SELECT 1 FROM _comm_rows_raw LIMIT 0")
        return True
    except TracekitError:
        return False


def _lists(df, extra=()):
    """DuckDB lists arrive as numpy arrays: make them plain lists (they print and serialise as JSON). A list
    already made (a group's members, shared by its rows) is kept as it is."""
    for c in df.columns:
        if c in _LIST_COLUMNS or c in extra:
            df[c] = df[c].map(lambda v: v if isinstance(v, list) else
                              [x if isinstance(x, str) else int(x) for x in v] if hasattr(v, "__len__") else None)
    return df


def _members(run, pg_ids) -> list:
    """Each pg_id's member list (_comm_groups), one Python list per group that every row of the group shares: a
    list per row is group size x rows integers (10 GB of 16,384 ranks' collectives in one group of all)."""
    ids = sorted({int(i) for i in pg_ids if not pd.isna(i)})
    members = {}
    if ids:
        got = run.sql("SELECT pg_id, pg_ranks FROM _comm_groups WHERE pg_id IN (SELECT unnest($ids::BIGINT[]))",
                      {"ids": ids})
        members = {int(i): [int(x) for x in v] for i, v in zip(got.pg_id, got.pg_ranks)}
    return [None if pd.isna(i) else members.get(int(i)) for i in pg_ids]


def _query_groups(run, name: str, order: str = "", **params):
    """analyses/<name>.sql whose rows carry pg_id and pg_ranks, with pg_ranks made by _members."""
    text = sql_text(name)
    df = run.sql(f"SELECT * EXCLUDE (pg_ranks) FROM ({text}) {order}", named_params(text, params, f"{name}.sql") or {})
    df.insert(list(documented_columns(name)).index("pg_ranks"), "pg_ranks", _members(run, df.pg_id))
    return df


def _setup(run, aligned: bool):
    offsets = None
    if aligned:
        from .clock import estimate_offsets

        offsets = estimate_offsets(run)
    prepare_views(run, offsets)
    return offsets


def _notes(run, df, offsets):
    notes = []
    if offsets is not None:
        notes.append("times aligned by estimated clock offsets (ns): " +
                     ", ".join(f"rank {r}: {o:+d}" for r, o in sorted(offsets.items())))
    if "ranks_not_traced" in df.columns and len(df):
        absent = sorted({r for v in df["ranks_not_traced"] if v for r in v})
        if absent:
            notes.append(f"{len(absent)} group member(s) have no trace in this set (a sampled or partial set): "
                         "their arrivals and waits are unknown, skew and transfer are over the traced ranks only")
    if not len(df):
        notes.append("no collectives in this trace (no c10d/NCCL/gloo communication ops)")
    elif "bytes" in df.columns and "op" in df.columns:
        unsized = df[df["bytes"].isna() & (df["op"] != "barrier")]
        if len(unsized):
            notes.append(f"{len(unsized)} of {len(df)} collective(s) without a size: neither their metadata, their "
                         "kernel, nor the call's or annotation's Input Dims carry one (ops: "
                         f"{', '.join(sorted(set(unsized['op'].astype(str))))}); their bandwidth is unknown")
    if notes:
        with_note(df, "; ".join(notes))
    return df


def process_group_configs(run) -> list[tuple[list, int]]:
    """Each distinct (pg_config, pg_count) of the ranks' distributedInfo, parsed: the process groups a rank's
    trace lists (dicts with pg_name, pg_desc, pg_size, ranks; a list, or what the trace holds instead) and their
    count (0 when absent). Every rank's document names every group's members, world_size^2 numbers over the ranks
    (16,384 documents of 16,384 ranks each), so each distinct list is parsed once."""
    df = run.sql("""SELECT DISTINCT json_extract(distributed_info_json, '$.pg_config')::VARCHAR AS pg_config,
                           TRY_CAST(json_extract(distributed_info_json, '$.pg_count') AS BIGINT) AS pg_count
                    FROM ranks WHERE json_valid(distributed_info_json) ORDER BY ALL""")
    out = []
    for cfg, n in zip(df.pg_config, df.pg_count):
        try:
            groups = json.loads(cfg) if isinstance(cfg, str) else None
        except ValueError:
            groups = None
        out.append((groups or [], 0 if pd.isna(n) else int(n)))
    return out


def collectives(run, rank: int | None = None, *, op: str | None = None, aligned: bool = False):
    """One row per (rank, collective): group, op, sizes, call and kernel, match key, arrival delay, wait;
    op: only that op (all_reduce, all_gather, ...)."""
    check_scope(run, rank)
    offsets = _setup(run, aligned)
    return _notes(run, _lists(_query_groups(run, "collectives", rank=rank, op=op)), offsets)


def comm_participants(run, ranks: list[int]):
    """The collective participants of the given ranks on the raw trace clocks (comm_participants.sql):
    what the dependency graph builds its collective instances from. Each instance's rows share one pg_ranks, its
    lowest rank's (the one the graph reads), one Python list per group: a list of the group's ranks on each of its
    ranks' rows is group size^2 integers (670 MB at 4,096 ranks in one group of all)."""
    prepare_views(run)
    rows = _query_groups(run, "comm_participants", "ORDER BY match_key, rank", ranks=ranks)
    lead = rows.drop_duplicates("match_key")  # rows are in rank order within an instance
    first = dict(zip(lead.match_key, lead.pg_ranks))
    rows["pg_ranks"] = [first[k] for k in rows.match_key]
    return rows


def collectives_matched(run, op: str | None = None, *, aligned: bool = False):
    """One row per matched collective: participants, arrival skew, transfer time, algbw / busbw, missing ranks."""
    offsets = _setup(run, aligned)
    return _notes(run, _lists(query(run, "collectives_matched", op=op)), offsets)


def straggler_attribution(run, rank: int | None = None, *, by_step: bool = False, aligned: bool = False):
    """Per rank (or step and rank): times last at a collective, average delay, waiting caused; worst first."""
    check_scope(run, rank)
    offsets = _setup(run, aligned)
    return _notes(run, _lists(query(run, "straggler_attribution", rank=rank, by_step=by_step)), offsets)


def clock_offsets(run):
    """Per-rank clock offsets estimated from matched collectives (see analyses/clock_offsets.sql)."""
    from .clock import clock_offsets as _clock

    return _clock(run)


NO_FR = ("no flight-recorder dumps in this trace directory (rank<R>.fr.json, *.pkl with entries); record with "
         "TORCH_FR_BUFFER_SIZE set, or with `tracekit record`")


def has_flight_recorder(run) -> bool:
    return bool(run.sql("SELECT count(*) AS n FROM fr_entries")["n"].iloc[0])


def comms_check(run):
    """Flight-recorder problems per group and collective: missing ranks, op / size / dtype / state mismatches."""
    df = _lists(query(run, "comms_check"), ("ranks_present", "suspect_ranks", "values"))
    if not has_flight_recorder(run):
        return with_note(df, NO_FR)
    if not len(df):
        with_note(df, "no problems: every collective in the dumps was joined by all its group's ranks, "
                      "with matching op, sizes, dtypes and states")
    return df


def comms_last_completed(run):
    """Per group and rank: the last collective enqueued, started and completed, and how far behind it is."""
    df = _lists(query(run, "comms_last_completed"))
    return df if has_flight_recorder(run) else with_note(df, NO_FR)


def has_nccl_tests(run) -> bool:
    return bool(run.sql("SELECT count(*) AS n FROM nccl_tests")["n"].iloc[0])


def bandwidth_report(run, op: str | None = None, *, below_ref_pct: float = 50.0, aligned: bool = False):
    """busbw per source, process group, op and size bucket (nccl-tests factors), with the slow outliers counted
    and, when the store holds an nccl-tests reference, busbw against it (below_ref_pct: the flag threshold)."""
    if not 0 < below_ref_pct <= 100:
        raise TracekitError(f"--below-ref-pct {below_ref_pct}: give a percentage in (0, 100]")
    offsets = _setup(run, aligned)
    df = _notes(run, _lists(query(run, "bandwidth_report", op=op, below_ref_pct=float(below_ref_pct))), offsets)
    if len(df) and not has_nccl_tests(run):
        note = df.attrs.get("note")
        with_note(df, "; ".join(filter(None, [note, "no nccl-tests reference in the store (tracekit ingest DIR "
                                              "--nccl-tests FILE): ref_* columns are empty"])))
    return df
