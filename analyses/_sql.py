"""Running an analysis's .sql file: load it, read its documented columns, bind
only the parameters it names, and install the shared helpers (_common.sql and
the kernel rules) on the connection first."""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.store import write_cache_file
from tracekit.store.sql import copy_sql, literal, statements

from .kernel_classes import resolve_rules

NO_GPU = "no GPU activity in this trace"
_PARAM = re.compile(r"\$([A-Za-z_]\w*)")
_COLUMN_DOC = re.compile(r"^--\s*@column\s+(\w+)\s+(.+)$")


_INCLUDE = re.compile(r"^--\s*@include\s+(_\w+)\s*$", re.MULTILINE)


@lru_cache(maxsize=None)
def sql_text(name: str) -> str:
    """analyses/<name>.sql with each `-- @include _fragment` line replaced by _fragment.sql, so that two
    analyses computing the same quantity share one copy of its SQL (private fragments start with '_')."""
    # a file next to this module, not importlib.resources: editable installs expose this
    # package as a namespace package, which resources cannot read
    text = Path(__file__).with_name(f"{name}.sql").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: sql_text(m.group(1)).rstrip() + "\n", text)


def documented_columns(name: str) -> dict[str, str]:
    """`-- @column NAME doc` lines of an analysis's .sql file, in order."""
    out = {}
    for line in sql_text(name).splitlines():
        m = _COLUMN_DOC.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def prepare(run, rules=None, replace_default_rules: bool = False) -> None:
    """(Re)write the kernel rules table and the shared macros on run's connection."""
    resolved = resolve_rules(rules, replace_default_rules)
    if _installed_rules(run) == resolved:
        return
    run.sql("CREATE OR REPLACE TEMP TABLE _kernel_rules (priority INTEGER, kernel_class VARCHAR, pattern VARCHAR)")
    if resolved:
        values = ", ".join(["(?, ?, ?)"] * len(resolved))
        flat = [v for i, (cls, pat) in enumerate(resolved) for v in (i, cls, pat)]
        run.sql(f"INSERT INTO _kernel_rules VALUES {values}", flat)
    cache = _classified_cache(run, resolved)
    for stmt in statements(sql_text("_common")):
        if _CLASSIFIED in stmt:
            if cache is not None and _read_cache(run, cache):
                continue
            run.sql(stmt if has_gpu_ops(run) else _no_rows(stmt))
            if cache is not None:
                _write_cache(run, cache)
        else:
            run.sql(stmt)


def _no_rows(statement: str) -> str:
    """A CREATE ... AS SELECT statement that makes its table with no rows: the columns without the query's scans.
    A run without device ops classifies none, and the launch join alone took 0.3 s of every 800-rank chunk of a
    CPU-only job (LIMIT 0 is planned as an empty result)."""
    return statement.rstrip().rstrip(";") + "\nLIMIT 0"


# _gpu_ops_classified (the launch join and the kernel rules over every device op: ~0.1 s on df_index_resolver's
# 22k ops, most of a question's time on a store) is kept in the store between connections, one file per store
# commit and rule set
_CLASSIFIED = "TEMP TABLE _gpu_ops_classified AS"


def _classified_cache(run, resolved) -> str | None:
    store = getattr(run, "store", None)
    if store is None or not hasattr(store, "cache_file") or getattr(run, "rank_subset", None) is not None:
        return None  # a subset of the ranks (Run.subset) classifies its own ops: the store's copy holds every rank's
    return store.cache_file("gpu_ops_classified", repr(resolved))


def _read_cache(run, path: str) -> bool:
    import duckdb

    if not os.path.isfile(path):
        return False
    try:
        # a view (1 ms; a table read 15-20 ms): the file is replaced only by a commit that changes the store's
        # contents, which replaces the table files every view of the connection reads as well
        run.con.execute(f"CREATE OR REPLACE TEMP VIEW _gpu_ops_classified AS SELECT * FROM read_parquet({literal(path)})")
        run.con.execute("SELECT 1 FROM _gpu_ops_classified LIMIT 0")
        return True
    except duckdb.Error:  # unreadable (a disk fault): compute it again, and replace the file
        return False


def _write_cache(run, path: str) -> None:
    """Best effort: a store that cannot be written to (read-only, full) answers without the cache."""
    write_cache_file(path, lambda tmp: run.con.execute(copy_sql("SELECT * FROM _gpu_ops_classified", tmp)))


def _installed_rules(run):
    """The rules the connection's helpers were built with, or None before the first prepare."""
    try:
        df = run.sql("SELECT kernel_class, pattern FROM _kernel_rules ORDER BY priority")
        run.sql("SELECT 1 FROM _gpu_ops_classified LIMIT 0")
    except TracekitError:
        return None
    return list(zip(df.kernel_class, df.pattern))


def named_params(text: str, params: dict, where: str) -> dict | None:
    """The parameters SQL text names ($param) with their values from params, None when it names none; a
    parameter params lacks is the caller's error (where: the file, for the message)."""
    wanted = dict.fromkeys(_PARAM.findall(text))
    missing = [p for p in wanted if p not in params]
    if missing:
        raise TypeError(f"{where} needs parameters {missing}")
    return {p: params[p] for p in wanted} or None


def query(run, name: str, **params):
    """Run analyses/<name>.sql with the parameters it names ($param), bound by DuckDB."""
    text = sql_text(name)
    return run.sql(text, named_params(text, params, f"{name}.sql") or {})


def check_scope(run, rank=None, step=None) -> None:
    """A rank or step the trace does not have is the user's error, named by its option."""
    if rank is not None:
        ranks = [int(r) for r in run.sql("SELECT DISTINCT rank FROM ranks ORDER BY rank")["rank"]]
        if int(rank) not in ranks:
            raise TracekitError(f"--rank {rank}: not in this trace (ranks: {', '.join(map(str, ranks)) or 'none'})")
    if step is not None:
        steps = [int(s) for s in run.sql(
            "SELECT DISTINCT step FROM steps WHERE $rank IS NULL OR rank = $rank ORDER BY step",
            {"rank": rank})["step"]]
        if int(step) not in steps:
            where = f" on rank {rank}" if rank is not None else ""
            raise TracekitError(f"--step {step}: not in this trace{where} (steps: {', '.join(map(str, steps)) or 'none'})")


def has_gpu_ops(run, rank=None) -> bool:
    """Whether the run (or the rank) has a GPU op (gpu_ops' rows): asked of the events themselves, so that it needs
    no view an analysis sets up, and stops at the first (LIMIT 1, pushed into the scan)."""
    return bool(run.sql("SELECT count(*) AS n FROM (SELECT 1 FROM _events WHERE ph = 'X' AND is_device_op(cat) "
                        "AND ($rank IS NULL OR rank = $rank) LIMIT 1)", {"rank": rank})["n"].iloc[0])


def with_note(df, note: str):
    df.attrs["note"] = note
    return df


def any_rank_without_gpu(run) -> bool:
    """Whether the CPU fallback timeline is needed (lets the queries skip scanning CPU events): the run's ranks
    (its manifest's; the ranks view opens every rank's file) against those with a classified GPU op."""
    with_gpu = run.sql("SELECT count(DISTINCT rank) AS n FROM _gpu_ops_classified")["n"].iloc[0]
    return int(with_gpu) < len(run.ranks)
