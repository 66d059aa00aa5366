"""The classified device ops kept in the store between connections (analyses/_sql.py, Store.cache_file): a later
connection answers from the file what the first computed, and nothing else ever reads it."""
from __future__ import annotations

import os
import shutil

import pandas as pd

import tracekit
from analyses._sql import prepare
from analyses.kernel_classes import resolve_rules
from analyses.registry import REGISTRY

from .conftest import tiny_events, write_trace

ANALYSES = ("temporal_breakdown", "kernel_breakdown", "idle_time_breakdown", "gpu_time_by_cpu_op")


def _cache_files(store) -> list[str]:
    """The analyses' cached tables (the cache also holds the store's views database, Store.views_db)."""
    d = os.path.join(store, "cache")
    return sorted(n for n in os.listdir(d) if n.endswith(".parquet")) if os.path.isdir(d) else []


def _answers(trace_dir, store) -> dict:
    run = tracekit.open(trace_dir, store=str(store))
    try:
        return {name: REGISTRY[name].func(run) for name in ANALYSES}
    finally:
        run.close()


def test_a_later_connection_answers_from_the_cache_what_the_first_computed(tiny_dir, tmp_path):
    store = tmp_path / "store"
    first = _answers(tiny_dir, store)
    assert len(_cache_files(store)) == 1
    run = tracekit.open(tiny_dir, store=str(store))
    prepare(run)
    # the later connection reads the file (a view over it), it does not compute the table again
    kind = run.sql("SELECT table_type FROM information_schema.tables WHERE table_name = '_gpu_ops_classified'")
    assert kind.table_type.tolist() == ["VIEW"]
    run.close()
    again = _answers(tiny_dir, store)
    for name in ANALYSES:
        pd.testing.assert_frame_equal(first[name], again[name], check_dtype=False)


def test_changed_contents_or_rules_never_read_an_old_cache(tiny_dir, tmp_path):
    store = tmp_path / "store"
    before = _answers(tiny_dir, store)
    old = _cache_files(store)
    # other rules: another file, and the answers of those rules
    run = tracekit.open(tiny_dir, store=str(store))
    rules = [("communication", "gemm")]
    prepare(run, rules=rules)
    assert run.sql("SELECT DISTINCT kernel_class FROM _gpu_ops_classified WHERE name = 'gemm_kernel'"
                   ).kernel_class.tolist() == ["communication"]
    run.close()
    assert len(_cache_files(store)) == 2
    # a changed trace: the commit clears the caches, and the new answers are the new trace's
    ev = tiny_events()
    for e in ev:
        if e.get("name") == "gemm_kernel":
            e["dur"] = 90
    write_trace(tiny_dir / "rank0.trace.json.gz", ev, rank=0, world_size=2)
    fresh = _answers(tiny_dir, store)
    assert not set(_cache_files(store)) & set(old)
    assert not fresh["kernel_breakdown"].equals(before["kernel_breakdown"])  # the longer kernel shows
    rebuilt = _answers(tiny_dir, tmp_path / "other_store")
    for name in ANALYSES:
        pd.testing.assert_frame_equal(fresh[name], rebuilt[name], check_dtype=False)
    assert resolve_rules(None, False) != resolve_rules(rules, False)


def test_a_store_that_cannot_be_written_answers_without_the_cache(tiny_dir, tmp_path):
    store = tmp_path / "store"
    computed = _answers(tiny_dir, store)
    # the cache's folder cannot be made (a file of its name; mode bits would not stop root)
    shutil.rmtree(store / "cache")
    (store / "cache").write_text("not a folder")
    again = _answers(tiny_dir, store)
    for name in ANALYSES:
        pd.testing.assert_frame_equal(computed[name], again[name], check_dtype=False)
    assert (store / "cache").read_text() == "not a folder"
