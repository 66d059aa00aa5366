"""The trace store: on-disk layout, locking, and the DuckDB connection with views.

Layout (readable by DuckDB, Spark or Trino as hive-partitioned Parquet):

    <store>/manifest.json                       the commit point (see manifest.py)
    <store>/<table>/rank=<R>/<key>-<gen>-<i>.parquet
    <store>/staging/                            work in progress, never read
    <store>/cache/                              derived, rebuilt at will: the views database, the analyses' tables
    <store>/lock                                held by the one writer

Every write goes through commit.py (staging, final names, the manifest switch, orphan removal);
SQL text is built with sql.py; the steps table is defined once, in steps.py, for ingest and the replay's writer. The store is the only input downstream of ingest: the trace
directory's run.json is a table here too (Store.run_manifest).

The default store of a trace directory is `<dir>/.tracekit/`; when that
directory is not writable, a per-user cache directory keyed by its path.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time

from ..errors import StoreError
from . import manifest as _manifest
from .schema import CACHE_DIR, SCHEMA_VERSION, TABLES
from . import devices
from .sql import literal, literal_list

STORE_DIRNAME = ".tracekit"


def default_store_dir(trace_dir: str) -> str:
    trace_dir = os.path.abspath(trace_dir)
    local = os.path.join(trace_dir, STORE_DIRNAME)
    if os.path.isdir(local) or os.access(trace_dir, os.W_OK):
        return local
    cache = os.environ.get("TRACEKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tracekit")
    key = hashlib.sha256(os.path.realpath(trace_dir).encode()).hexdigest()[:16]
    return os.path.join(cache, "stores", f"{os.path.basename(trace_dir.rstrip(os.sep)) or 'root'}-{key}")


@contextlib.contextmanager
def writer_lock(store_dir: str, wait_s: float = 600.0, on_wait=None):
    """One writer at a time: a second ingest waits, then fails cleanly."""
    os.makedirs(store_dir, exist_ok=True)
    fd = os.open(os.path.join(store_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and on_wait:
                    on_wait()
                    told = True
                if time.monotonic() > deadline:
                    raise StoreError(f"{store_dir}: another tracekit ingest has held the store for {wait_s:.0f} s; "
                                     "let it finish, or stop it and run ingest again") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class Store:
    """A committed store: its manifest and a read-only DuckDB view over it."""

    def __init__(self, store_dir: str):
        self.path = os.path.abspath(store_dir)
        m = _manifest.load(self.path)
        if m is None:
            raise StoreError(f"{self.path}: no store here; run `tracekit ingest` on the trace directory first")
        if m.schema_version != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: store schema v{m.schema_version}, this tracekit reads v{SCHEMA_VERSION}; "
                             "run `tracekit ingest` again to rebuild it")
        self.manifest = m

    def files(self, table: str, ranks=None) -> list[str]:
        """The table's files; ranks: only those of these ranks' sources (and of the run's own, rank -1)."""
        if ranks is None:
            return [os.path.join(self.path, p) for p in self.manifest.files(table)]
        keep = {int(r) for r in ranks}
        srcs = self.manifest.sources
        return [os.path.join(self.path, p) for name in sorted(srcs) for p in srcs[name].files.get(table, [])
                if srcs[name].rank is None or int(srcs[name].rank) < 0 or int(srcs[name].rank) in keep]

    def missing_files(self) -> list[str]:
        """The table files the manifest names that are not there (a store moved, copied in part or replaced
        underneath)."""
        return [f for table in TABLES for f in self.files(table) if not os.path.exists(f)]

    def reopened(self, failure: str) -> "Store":
        """After a query failed on a file of this store (`failure`, DuckDB's message): the store now
        committed at this path, when it was replaced underneath (its views are then rebuilt for it);
        StoreError, naming the store and what to do, when it was moved or removed, or lost files."""
        if not os.path.isfile(os.path.join(self.path, _manifest.MANIFEST)):
            raise StoreError(f"{self.path}: the store was moved or removed while in use ({failure}); open it "
                             "where it is now, or run the command again to ingest the traces anew")
        now = Store(self.path)
        if now.manifest.to_json() != self.manifest.to_json():
            return now  # replaced underneath (another ingest committed): the views of the new contents
        missing = now.missing_files()
        if missing:
            raise _incomplete(self.path, missing)
        raise StoreError(f"{self.path}: {failure}")

    def cache_file(self, name: str, key: str, ext: str = ".parquet") -> str:
        """Where derived data of this store's contents lives between connections: CACHE_DIR/<name>-<digest><ext>,
        the digest of the schema, every source's checksum and table files (which a re-ingest of a changed or
        forced source renames) and `key`, so that other contents or another key never find an old file. Whoever
        writes one writes it whole under another name, renames it and removes the name's older files."""
        h = hashlib.sha1(f"{SCHEMA_VERSION}|{key}".encode())
        for src in sorted(self.manifest.sources):
            e = self.manifest.sources[src]
            h.update(f"|{src}|{e.sha256}|{sorted((t, tuple(ps)) for t, ps in e.files.items())}".encode())
        return os.path.join(self.path, CACHE_DIR, f"{name}-{h.hexdigest()[:16]}{ext}")

    @property
    def ranks(self) -> list[int]:
        return sorted(e.rank for e in self.manifest.sources.values() if e.kind == "trace")

    def run_manifest(self) -> dict:
        """The run manifest (the trace directory's run.json, as capture wrote it) ingested into this store;
        {} when there was none. A fresh dict each call."""
        files = self.files("run_manifest")
        if not files:
            return {}
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return json.loads(pq.read_table(files[0], columns=["doc_json"]).column(0)[0].as_py())
        except (OSError, pa.ArrowException, ValueError, IndexError) as e:
            raise StoreError(f"{files[0]}: unreadable run manifest ({e}); run `tracekit ingest` again") from None

    def connect(self, *, allow_external_access: bool = False, ranks=None):
        """A DuckDB connection with the store's views (ranks: over these ranks' files only, a subset's views: a
        query reads no other rank's file, which hive-partition filters would still list and plan).

        By default the connection cannot read or write any file beyond the
        store (enable_external_access off after the views bind, extension
        auto-install off): user SQL gets the data, not the machine.

        The views live in a small DuckDB database in the store's cache (views_db), attached read-only:
        creating them binds every view (0.03-0.05 s, a third of a connect), attaching them does not. The
        connection's own database stays the default, so what a caller creates goes there. Without that
        file (a read-only store, a DuckDB that cannot read it) the views are created in the connection.
        """
        import duckdb

        con = duckdb.connect(config={"threads": min(os.cpu_count() or 1, 8), "autoinstall_known_extensions": False,
                                     "autoload_known_extensions": False})
        # no progress bar: on long queries DuckDB would print it into stdout, which is the CLI's output.
        # (Inside Jupyter without ipywidgets DuckDB refuses to touch the setting; it draws none there.)
        try:
            con.execute("SET enable_progress_bar = false")
        except duckdb.Error:
            pass
        files = {table: self.files(table, ranks) for table in TABLES}
        # views over files that are not there are never served. Each table's first file is checked here (a
        # store moved away or replaced has none of its files; 10 stats, where all of them would cost ~16 ms at
        # 1,024 ranks); a query that meets any other missing one reopens the store (Run._execute)
        if any(fs and not os.path.exists(fs[0]) for fs in files.values()):
            con.close()
            raise _incomplete(self.path, self.missing_files())
        if ranks is not None or not self._attach_views(con, files):  # a subset's views: bound here, not cached
            _create_views(con, files)
        if not allow_external_access:
            # the directories of the tables that have files (DuckDB resolves "..", and every file there
            # is this store's data): a list of every file cost ~12 us a path (88 ms at 1,024 ranks)
            dirs = [os.path.join(self.path, table) + os.sep for table in TABLES if files[table]]
            dirs.append(os.path.join(self.path, CACHE_DIR) + os.sep)  # cache_file: the analyses' derived tables
            con.execute("SET allowed_directories = " + literal_list(dirs))
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        return con

    def views_db(self) -> str:
        """The cache file that holds this store's views (see connect): named by the store's contents, its
        path (the views name absolute files), the views' SQL (the tables' empty stand-ins included) and the
        DuckDB version that wrote it."""
        import duckdb

        stand_ins = "".join(_empty_view_sql(f"_{t}", columns) for t, columns in TABLES.items())
        key = f"{self.path}|{duckdb.__version__}|{_VIEWS_SQL}|{devices.macros_sql()}|{stand_ins}"
        return self.cache_file("views", hashlib.sha1(key.encode()).hexdigest(), ".duckdb")

    def _attach_views(self, con, files: dict[str, list[str]]) -> bool:
        """Attach views_db (writing it first when it is not there); False where that cannot be done."""
        import duckdb

        path = self.views_db()
        for _ in range(2):
            if not os.path.exists(path) and not _write_views_db(path, files):
                return False
            try:
                con.execute(f"ATTACH {literal(path)} AS {_VIEWS_CATALOG} (READ_ONLY)")
                con.execute(f"SET search_path = 'memory.main,{_VIEWS_CATALOG}.main'")
                return True
            except duckdb.Error:  # unreadable (cut short, another DuckDB's): write it again, once
                with contextlib.suppress(duckdb.Error):
                    con.execute(f"DETACH DATABASE IF EXISTS {_VIEWS_CATALOG}")
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return False


_VIEWS_CATALOG = "tracekit_views"


def _incomplete(path: str, missing: list[str]) -> StoreError:
    return StoreError(f"{path}: {len(missing)} file(s) its manifest names are missing (e.g. "
                      f"{os.path.relpath(missing[0], path)}): the store was moved, copied in part or changed "
                      "underneath; run `tracekit ingest --force` on the trace directory to rebuild it")


def _create_views(con, files: dict[str, list[str]]) -> None:
    """The store's views (views.sql, the device macros and one view per table) on `con`."""
    # The public views are created over empty stand-ins of the tables (same columns, same order) and the
    # stand-ins then replaced by the Parquet views: DuckDB binds a view when it is created, and binding a
    # view over a list of files parses every path (hive partitioning), once per view that reaches it
    # (the events view reaches four tables, kernels the same four again, ...). Queries bind the views anew,
    # so they see the Parquet files; at 1,024 ranks this took connect from 0.61 s to 0.15 s.
    for table, columns in TABLES.items():
        create_table_view(con, f"_{table}", [], columns)
    for stmt in devices.macros_sql():
        con.execute(stmt)
    con.execute(_VIEWS_SQL)
    for table, columns in TABLES.items():
        if files[table]:
            create_table_view(con, f"_{table}", files[table], columns)


def write_cache_file(path: str, write) -> bool:
    """Write a cache file (Store.cache_file) whole: write(tmp) makes it under another name, which is then
    renamed to `path`. Best effort: False, and nothing left behind, when the store cannot be written to
    (read-only, full) or write fails with a DuckDB error."""
    import duckdb

    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
        return True
    except (OSError, duckdb.Error):
        for leftover in (tmp, tmp + ".wal"):  # a DuckDB database's log, when write made one
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        return False


def _write_views_db(path: str, files: dict[str, list[str]]) -> bool:
    """Write the views database at `path` and remove those of earlier contents (never found again)."""
    import duckdb

    def write(tmp: str) -> None:
        with duckdb.connect(tmp, config={"autoinstall_known_extensions": False,
                                         "autoload_known_extensions": False}) as db:
            _create_views(db, files)

    if not write_cache_file(path, write):
        return False
    folder, name = os.path.split(path)
    prefix = name.split("-")[0] + "-"
    for other in os.listdir(folder):
        if other.startswith(prefix) and other.endswith(".duckdb") and other != name:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, other))
    return True


def create_table_view(con, name: str, files: list[str], columns) -> None:
    """A view over one table's Parquet files, with `rank` from the hive path."""
    if files:
        # one schema version per store (the manifest enforces it): no union_by_name needed
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({literal_list(files)}, "
                    "hive_partitioning = true, "
                    "hive_types = {'rank': BIGINT})")
    else:
        con.execute(_empty_view_sql(name, columns))


def _empty_view_sql(name: str, columns) -> str:
    """An empty table's view: its columns in the order a view over files has them (the schema's, then rank,
    which hive partitioning appends)."""
    cols = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t, _ in columns)
    return f"CREATE OR REPLACE VIEW {name} AS SELECT {cols}, CAST(NULL AS BIGINT) AS rank WHERE false"


def _load_views_sql() -> str:
    here = os.path.dirname(__file__)
    with open(os.path.join(here, "views.sql"), encoding="utf-8") as f:
        return f.read()


_VIEWS_SQL = _load_views_sql()
