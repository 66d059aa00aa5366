"""Run: the Python handle on one stored run (measured or replayed)."""
from __future__ import annotations

import os
from typing import Any

from .errors import StoreError, TracekitError
from .extensions import provider
from .store import Store, default_store_dir
from .store.manifest import MANIFEST


def open_run(path, store: str | None = None, *, ingest: bool = True, **ingest_options) -> "Run":
    path = os.fspath(path)
    if store is None and os.path.isfile(os.path.join(path, MANIFEST)):
        return Run(Store(path), trace_dir=None)
    if not os.path.isdir(path):
        raise TracekitError(f"{path}: not a directory; pass a trace directory or a store")
    store_dir = store or default_store_dir(path)
    if ingest:
        from .ingest import ingest as _ingest

        _ingest(path, store_dir, **ingest_options)
    return Run(Store(store_dir), trace_dir=os.path.abspath(path))


class Run:
    """SQL over one run's store. DataFrames out; the connection is read-only
    towards the file system (see Store.connect)."""

    def __init__(self, store: Store, trace_dir: str | None = None, *, allow_external_access: bool = False,
                 ranks=None):
        self.store = store
        self.trace_dir = trace_dir or store.manifest.trace_dir
        # off: SQL sees the store and nothing else, and cannot write files (see _execute)
        self.allow_external_access = allow_external_access
        # a subset of the ranks (Run.subset): the views read only their files
        self.rank_subset = None if ranks is None else sorted({int(r) for r in ranks})
        self._con = None

    @property
    def con(self):
        if self._con is None:
            self._con = self.store.connect(allow_external_access=self.allow_external_access, ranks=self.rank_subset)
        return self._con

    def subset(self, ranks) -> "Run":
        """This run seen through some of its ranks only (every view reads only their files): a per-rank analysis
        on it gives those ranks' rows. A rank the run does not have is the caller's error."""
        ranks = sorted({int(r) for r in ranks})
        unknown = sorted(set(ranks) - set(self.ranks))
        if unknown:
            raise TracekitError(f"rank {unknown[0]}: not in this run (ranks {rank_span(self.ranks)})")
        return Run(self.store, self.trace_dir, allow_external_access=self.allow_external_access, ranks=ranks)

    def sql(self, query: str, params: Any = None):
        """Run SQL against the store's views; return a pandas DataFrame."""
        return self._execute(query, params).df()

    def arrow(self, query: str, params: Any = None):
        """Run SQL against the store's views; return a pyarrow Table."""
        return self._execute(query, params, relation=True).to_arrow_table()

    def _execute(self, query: str, params: Any, relation: bool = False):
        import duckdb

        for attempt in (0, 1):
            try:
                if not self.allow_external_access:
                    self._refuse_file_statements(query)
                if relation:
                    return self.con.sql(query, params=params)
                return self.con.execute(query, params) if params is not None else self.con.execute(query)
            except duckdb.Error as e:
                message = str(e)
                first_line = message.splitlines()[0]
                # an IOException on a file of the store: the store was replaced (views rebuilt for its new
                # contents, the query run once more), or moved or damaged (Store.reopened says so); never a
                # stale view served
                if attempt or not isinstance(e, duckdb.IOException) or self.store.path + os.sep not in message:
                    raise TracekitError(f"query failed: {first_line}") from None
                self.store = self.store.reopened(first_line)
                self.close()

    def _refuse_file_statements(self, query: str) -> None:
        # DuckDB lets a connection write wherever it may read, and the store's own files
        # are readable: a COPY ... (USE_TMP_FILE false) or an ATTACH could overwrite them.
        import duckdb

        for st in self.con.extract_statements(query):
            if st.type in _FILE_STATEMENTS(duckdb):
                raise TracekitError(f"{st.type.name} statements are refused: queries may read the store but not "
                                    "touch files or load extensions; pass --allow-external-access "
                                    "(Python: allow_external_access=True) to allow them")

    @property
    def ranks(self) -> list[int]:
        return self.store.ranks if self.rank_subset is None else list(self.rank_subset)

    def run_manifest(self) -> dict:
        """The run's run.json (job shape, per-rank hosts, parallel layout, measured step times) as ingested
        into the store; {} when the trace directory had none. Read from the store, never the trace
        directory, so a store moved away from its traces still has it."""
        return self.store.run_manifest()

    def analyze(self, name: str, **params):
        """Run analysis NAME (see `tracekit analyze --list`) on this run; returns a DataFrame."""
        # the analyses sit above the core: reached through their extension point, never imported here
        return provider("analyze")(self, name, **params)

    @property
    def plot(self):
        """Figures of this run's analyses: run.plot.step_time(), run.plot.top_kernels(), ...
        (needs the `report` extra: plotly)."""
        return provider("plot")(self)

    def info(self) -> dict:
        from .info import run_info

        return run_info(self)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<tracekit.Run {self.trace_dir!r}: {len(self.ranks)} rank(s), store {self.store.path!r}>"


def rank_span(ranks: list[int]) -> str:
    """A list of ranks for a message: "0..4095", or each of a few."""
    return "none" if not ranks else f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 8 else ", ".join(map(str, ranks))


def _FILE_STATEMENTS(duckdb):  # noqa: N802 - a constant that needs the lazily imported module
    t = duckdb.StatementType
    return {t.COPY, t.ATTACH, t.DETACH, t.EXPORT, t.LOAD, t.COPY_DATABASE, t.EXTENSION}


__all__ = ["Run", "open_run", "StoreError"]
