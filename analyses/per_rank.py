"""Per-rank analyses over many ranks: the ranks in chunks, each chunk on its own view of the store.

An analysis in PER_RANK gives each rank rows computed from that rank's events alone (its steps, its ops, its
collective calls), so it can run on a chunk of ranks (Run.subset: views over those ranks' files only) and the
chunks' rows, concatenated, are the whole run's. What that buys on a big store:

- memory bounded by a chunk: DuckDB's sorts and windows (interval unions per rank) over 4,096 ranks' 17.5 M CPU
  ops held 7.7 GB at once; a chunk holds CHUNK_EVENTS events' worth;
- the chunks on a Dask cluster (`executor="dask://HOST:PORT"`, the ingest's executor), each worker opening the
  store at the same path (a shared filesystem, as the ingest needs), the rows identical to a local run;
- a sample: `ranks=` runs the analysis on those ranks only (`tracekit analyze --ranks`), the sample said in the
  result's note.

A rank's rows never depend on which chunk it is in: tests/test_per_rank.py checks every PER_RANK analysis in one
chunk against one chunk per rank.
"""
from __future__ import annotations

import os

import pandas as pd

from tracekit.errors import TracekitError
from tracekit.run import rank_span

# analyses whose rows for a rank depend on that rank's own data only
PER_RANK = frozenset({
    "temporal_breakdown", "comm_comp_overlap", "exposed_comm", "idle_time_breakdown", "compute_per_step",
    "data_loading", "sync_calls", "small_kernels", "memory_peak", "queue_length_summary",
})
# events per chunk: DuckDB's sorts and windows hold ~200 bytes a row of what they order; 4 M events (800 ranks of the
# many-ranks benchmark, 4 ranks of a 1 M-event GPU trace) keep a chunk near 1 GB
CHUNK_EVENTS = 4_000_000
# analyses whose chunk is half DuckDB (both cores) and half numpy (one core): two chunks at a time keep the cores
# busy, at twice a chunk's memory (the temporal breakdown at 4,096 ranks: 4.9 -> 3.9 s, 0.65 -> 0.92 GB)
OVERLAPPED = frozenset({"temporal_breakdown"})
# the whole run's rows kept in the store's cache (Store.cache_file: the store's contents and the parameters name
# the file): exposed_comm, which every what-if reads for its measured column (a minute at 4,096 ranks)
CACHED = frozenset({"exposed_comm"})


def chunks(ranks: list[int], events: dict[int, int] | None = None, budget: int | None = None) -> list[list[int]]:
    """The ranks in order, cut where the next rank would take a chunk's events (`events`: rank -> count) over
    `budget` (default CHUNK_EVENTS); a rank above it alone. Without counts, `budget` is a number of ranks."""
    budget = CHUNK_EVENTS if budget is None else budget
    out, cur, total = [], [], 0
    for r in ranks:
        n = 1 if events is None else max(1, int(events.get(r, 0)))
        if cur and total + n > budget:
            out.append(cur)
            cur, total = [], 0
        cur.append(r)
        total += n
    if cur:
        out.append(cur)
    return out


def event_counts(run) -> dict[int, int]:
    """rank -> events stored, from the store's manifest (no query: at 4,096 ranks one of the ranks table takes
    0.6 s, and every per-rank analysis asks)."""
    out: dict[int, int] = {}
    for e in run.store.manifest.sources.values():
        if e.kind == "trace" and e.rank is not None:
            out[int(e.rank)] = out.get(int(e.rank), 0) + int(e.event_count or 0)
    return out


def run_per_rank(run, name: str, params: dict, *, ranks=None, executor=None, chunk_ranks: int | None = None):
    """Analysis NAME (one of PER_RANK) on run's ranks (or `ranks`), a chunk of ranks at a time (CHUNK_EVENTS events,
    or chunk_ranks ranks when given): locally one chunk after the other, or on the Dask cluster of `executor` (an
    Executor or 'dask://HOST:PORT'). Returns the rows of every chunk in rank order; the chunks' notes, once each."""
    if name not in PER_RANK:
        raise TracekitError(f"{name}: not a per-rank analysis, so it cannot run on part of the ranks "
                            f"(per-rank: {', '.join(sorted(PER_RANK))})")
    every = run.ranks
    chosen = every if ranks is None else sorted({int(r) for r in ranks})
    if ranks is not None:
        unknown = sorted(set(chosen) - set(every))
        if unknown:
            raise TracekitError(f"--ranks: rank {unknown[0]} is not in this run ({len(every)} ranks, "
                                f"{rank_span(every)})")
    executor = _executor(executor)  # a bad spec fails before the cache is read
    cache = _cache_file(run, name, params) if ranks is None else None
    if cache is not None and os.path.isfile(cache):
        try:
            return pd.read_parquet(cache)
        except (OSError, ValueError):  # unreadable (a disk fault): computed again, and the file replaced
            pass
    if params.get("rank") is not None:  # one rank asked for (--rank): it is its own chunk, checked as usual
        parts = [chosen]
    elif chunk_ranks is not None:
        parts = chunks(chosen, None, max(1, int(chunk_ranks)))
    else:
        parts = chunks(chosen, event_counts(run))
    frames = map_chunks(run, parts, _analysis_chunk, (name, params), executor=executor, what=name,
                        at_once=2 if name in OVERLAPPED else 1)
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    notes = list(dict.fromkeys(f.attrs.get("note") for f in frames if f.attrs.get("note")))
    if ranks is not None:
        notes.insert(0, f"ranks: {len(chosen)} of {len(every)} ({_describe(chosen)}); the other ranks are not in "
                        "these rows")
    out.attrs = {"note": "; ".join(notes)} if notes else {}
    if cache is not None and not notes:  # (a note would not survive the file)
        from tracekit.store import write_cache_file

        write_cache_file(cache, lambda tmp: out.to_parquet(tmp, index=False))
    return out


def _cache_file(run, name: str, params: dict) -> str | None:
    store = getattr(run, "store", None)
    if name not in CACHED or store is None or getattr(run, "rank_subset", None) is not None:
        return None
    return store.cache_file(name, repr(sorted((k, repr(v)) for k, v in params.items())))


def parse_ranks(spec: str, every: list[int]) -> list[int]:
    """'0-15,32,64' -> those ranks (each in the run); a malformed spec or a rank the run lacks is the user's error,
    named as --ranks."""
    out = set()
    for part in spec.replace(" ", "").split(","):
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise TracekitError(f"--ranks {spec!r}: expected ranks and ranges like 0-15,32,64") from None
        if b < a:
            raise TracekitError(f"--ranks {spec!r}: the range {part} runs backwards")
        out.update(range(a, b + 1))
    missing = sorted(out - set(every))
    if missing:
        raise TracekitError(f"--ranks {spec!r}: rank {missing[0]} is not in this run ({len(every)} ranks, "
                            f"{rank_span(every)})")
    return sorted(out)


def sample_ranks(every: list[int], n: int) -> list[int]:
    """A stated sample of n ranks: evenly spaced over the run's ranks (the first always in), as HTA's trace
    filter samples ranks; n at least 1."""
    if n < 1:
        raise TracekitError(f"--sample-ranks {n}: the sample needs at least 1 rank")
    if n >= len(every):
        return list(every)
    stride = len(every) / n
    return sorted({every[int(i * stride)] for i in range(n)})


def _describe(ranks: list[int]) -> str:
    if len(ranks) <= 8:
        return ", ".join(map(str, ranks))
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    if len(steps) == 1:
        return f"every {steps.pop()}th from {ranks[0]} to {ranks[-1]}"
    return f"{ranks[0]}, {ranks[1]}, ... {ranks[-1]}"


def map_chunks(run, parts: list[list[int]], task, args: tuple = (), *, executor=None, what: str = "a pass",
               at_once: int = 1):
    """[task(chunk_run, part, *args) for part in parts], where chunk_run is run's view of that part's ranks
    (Run.subset; run itself for one part of every rank): locally `at_once` parts at a time (threads, each part on
    its own connection), or on the Dask cluster of `executor` (an Executor or its spec), each worker opening the
    store at the same path. task: a module-level function (a worker imports it)."""
    executor = _executor(executor)
    if executor is not None and executor.kind == "dask":
        return _on_dask(run, parts, task, args, executor, what)
    if len(parts) == 1 and list(parts[0]) == list(run.ranks):
        return [task(run, parts[0], *args)]

    def one(part):
        sub = run.subset(part)
        try:
            return task(sub, part, *args)
        finally:
            sub.close()

    if at_once <= 1 or len(parts) == 1:
        return [one(part) for part in parts]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="tracekit-chunk") as pool:
        return list(pool.map(one, parts))


def _executor(executor):
    from tracekit.ingest.executor import as_executor  # (the ingest package: loaded only when asked)

    return as_executor(executor)


def _analysis_chunk(run, part, name: str, params: dict):
    from .registry import get

    return get(name).func(run, **params)


def chunk_task(store_path: str, ranks: list[int], task, args: tuple, allow_external_access: bool):
    """On a Dask worker: task on one chunk of ranks of the store at store_path (the same path there)."""
    from tracekit.run import Run
    from tracekit.store import Store

    run = Run(Store(store_path), allow_external_access=allow_external_access, ranks=ranks)
    try:
        return task(run, ranks, *args)
    finally:
        run.close()


def _on_dask(run, parts: list[list[int]], task, args: tuple, ex, what: str) -> list[pd.DataFrame]:
    from tracekit.ingest.executor import dask_client

    with dask_client(ex, "leave --executor out") as client:
        futures = [client.submit(chunk_task, run.store.path, part, task, args, run.allow_external_access, pure=False)
                   for part in parts]
        try:
            return client.gather(futures)
        except TracekitError:
            raise
        except Exception as e:  # a worker died, or cannot see the store
            raise TracekitError(f"--executor {ex}: a chunk of {what} failed on a Dask worker ({type(e).__name__}: "
                                f"{e}); the store must be on a filesystem every worker sees under the same "
                                "path") from None

