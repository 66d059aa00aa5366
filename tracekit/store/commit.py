"""Committing to a store: the one write path of ingest and replay.

Owns every step that makes new files part of a store: the staging directory where files are built,
their final names (`<table>/rank=<R>/<key>-<gen>-<i>.parquet`, fresh per generation so a commit
never overwrites a file a reader may hold), moving staged files there, the manifest switch (the
commit point: write, fsync, rename) and removing the files no manifest names any more. A crash at any
moment leaves the old or the new manifest, and both name complete files; the next commit removes
the leftovers.

Ingest commits the sources it read into the store's manifest (place, switch_manifest, remove_orphans);
a writer that builds every file of a store anew (the replay's) commits with `rewrite`, and a store that
does not exist yet is built beside its directory and renamed into place (`new_store`), so the
directory never holds a half-written store.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable

from ..errors import StoreError
from .manifest import MANIFEST, Manifest
from .schema import CACHE_DIR, TABLES

STAGING = "staging"


def new_generation() -> str:
    """A fresh generation id: part of every file name one commit writes."""
    return uuid.uuid4().hex[:12]


def staging_dir(store_dir: str, gen: str) -> str:
    """Where the files of generation `gen` are built; never read by a reader."""
    return os.path.join(store_dir, STAGING, gen)


def clear_staging(store_dir: str) -> None:
    shutil.rmtree(os.path.join(store_dir, STAGING), ignore_errors=True)


def final_name(table: str, rank: int, source: str, gen: str, i: int) -> str:
    """The path, relative to the store, of the i-th file of `table` that `source` gives in generation `gen`."""
    key = hashlib.sha1(source.encode()).hexdigest()[:12]
    return os.path.join(table, f"rank={rank}", f"{key}-{gen}-{i}.parquet")


def place(store_dir: str, gen: str, source: str, rank: int, staged: dict[str, list[str]]) -> dict[str, list[str]]:
    """Move one source's staged files to their final names; return table -> paths relative to the store."""
    files: dict[str, list[str]] = {}
    for table in TABLES:
        files[table] = []
        if not staged.get(table):  # no empty rank directories (10 tables x 1024 ranks, removed again later)
            os.makedirs(os.path.join(store_dir, table), exist_ok=True)
            continue
        for i, path in enumerate(staged[table]):
            rel = final_name(table, rank, source, gen, i)
            os.makedirs(os.path.join(store_dir, os.path.dirname(rel)), exist_ok=True)
            os.replace(path, os.path.join(store_dir, rel))
            files[table].append(rel)
    return files


def switch_manifest(store_dir: str, manifest: Manifest) -> None:
    """Make `manifest` the store's committed state: write it beside the old one, fsync, rename over it."""
    manifest.updated_ns = time.time_ns()
    path = os.path.join(store_dir, MANIFEST)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest.to_json(), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(store_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def rewrite(store_dir: str, build: Callable[[str], tuple[Manifest, dict[str, tuple[int, dict[str, list[str]]]]]]
            ) -> Manifest:
    """Replace the whole contents of the store at `store_dir` in one commit; return the manifest committed.

    build(staging) writes every file under the directory `staging` (inside the store, never read) and returns
    the manifest to commit with, per source in it, (rank, table -> staged file paths). The staged files are
    moved to their final names and the manifest switched; the files no manifest names any more go. A failure
    before the switch removes what it had moved (no manifest names it) and the staging directory: the store
    stays as it was. The caller holds the store's writer lock when others may write it."""
    gen = new_generation()
    placed: list[str] = []
    try:
        manifest, staged = build(staging_dir(store_dir, gen))
        try:
            for source, (rank, files) in staged.items():
                manifest.sources[source].files = place(store_dir, gen, source, rank, files)
                placed += [os.path.join(store_dir, p) for ps in manifest.sources[source].files.values() for p in ps]
            switch_manifest(store_dir, manifest)
        except BaseException:
            for path in placed:
                unlink(path)
            raise
    finally:
        clear_staging(store_dir)
    remove_orphans(store_dir, manifest)
    return manifest


@contextlib.contextmanager
def new_store(store_dir: str):
    """Build a store that does not exist yet (store_dir absent or an empty directory): yields a private folder
    beside store_dir (the same filesystem) to commit it in, and renames that folder into place when the block
    ends without error. store_dir never holds a half-written store, and a failure leaves nothing behind
    (a crash leaves the folder `.<name>.new-<id>` beside it, which no reader opens)."""
    store_dir = os.path.abspath(store_dir)
    parent, name = os.path.split(store_dir)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{store_dir}: cannot create the directory ({e.strerror})") from None
    tmp = os.path.join(parent, f".{name}.new-{new_generation()}")
    try:
        os.mkdir(tmp)
        yield tmp
        try:
            os.rename(tmp, store_dir)  # replaces an empty directory; fails on a non-empty one
        except OSError as e:
            raise StoreError(f"{store_dir}: could not move the new store into place ({e.strerror}); was the "
                             "directory filled meanwhile? write it again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_orphans(store_dir: str, manifest: Manifest, contents_changed: bool = True) -> None:
    """Delete the table files `manifest` does not name (replaced partitions, a replaced replay, leftovers of an
    interrupted commit), the folders that leaves empty, the staging directory, and where the contents changed
    the analyses' caches (Store.cache_file: their names would never be found again)."""
    if contents_changed:
        shutil.rmtree(os.path.join(store_dir, CACHE_DIR), ignore_errors=True)
    keep = {os.path.normpath(p) for e in manifest.sources.values() for ps in e.files.values() for p in ps}
    for table in TABLES:
        top = os.path.join(store_dir, table)
        for root, _dirs, names in os.walk(top):
            for name in names:
                full = os.path.join(root, name)
                if os.path.normpath(os.path.relpath(full, store_dir)) not in keep:
                    unlink(full)
        for root, dirs, names in os.walk(top, topdown=False):
            if root != top and not os.listdir(root):
                try:
                    os.rmdir(root)
                except OSError:
                    pass
    clear_staging(store_dir)


def unlink(path: str) -> None:
    """Remove a file if it is there (best effort: a file left behind is an orphan the next commit removes)."""
    try:
        os.unlink(path)
    except OSError:
        pass
