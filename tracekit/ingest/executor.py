"""Where the per-file map runs: the local process pool, or a Dask distributed cluster.

    --executor local          the local pool, one worker per core (the default)
    --executor local[N]       the local pool with N workers
    --executor dask://HOST:PORT   the Dask scheduler at HOST:PORT (`dask scheduler` listens on 8786)

Each task maps one trace file to its staged Parquet files (kineto.ingest_kineto) and returns the
file list and the file's metadata; only the client commits the manifest. Dask workers may run on
other machines, so the trace directory and the store (its staging directory, where workers write)
must be on a filesystem that the client and every worker see under the same path.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import TraceFileError, TracekitError
from .kineto import FileResult

FORMS = "local, local[N] (N worker processes) or dask://HOST:PORT (a Dask scheduler)"
_LOCAL_N = re.compile(r"^local\[(\d+)\]$")
_DASK = re.compile(r"^dask://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


@dataclass(frozen=True)
class Executor:
    kind: str  # "local" | "dask"
    jobs: int | None = None  # local: worker processes (None: one per core)
    address: str | None = None  # dask: tcp://HOST:PORT

    def __str__(self) -> str:
        if self.kind == "dask":
            return "dask://" + self.address.removeprefix("tcp://")
        return f"local[{self.jobs}]" if self.jobs else "local"


def parse_executor(spec: str | None) -> Executor:
    """'local', 'local[N]', 'dask://HOST:PORT' -> Executor; anything else is the user's error."""
    if spec is None or spec.strip() == "local":
        return Executor("local")
    s = spec.strip()
    m = _LOCAL_N.match(s)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= 512:
            raise TracekitError(f"--executor {spec!r}: N must be 1 to 512; use {FORMS}")
        return Executor("local", jobs=n)
    m = _DASK.match(s)
    if m:
        port = int(m.group(2))
        if not 1 <= port <= 65535:
            raise TracekitError(f"--executor {spec!r}: port {port} is out of range; use {FORMS}")
        return Executor("dask", address=f"tcp://{m.group(1)}:{port}")
    raise TracekitError(f"--executor {spec!r}: not an executor; use {FORMS}")


def as_executor(executor) -> Executor | None:
    """An Executor from a spec ('dask://HOST:PORT', 'local', ...: parse_executor), or the one given, or None."""
    return None if executor is None or isinstance(executor, Executor) else parse_executor(executor)


def dask_task(task: dict) -> dict:
    """Run on a Dask worker: one trace file -> its staged files. Returns the local pool's reply
    (`{"ok": FileResult fields}` or `{"error": {"path", "reason"}}`), plain data that pickles anywhere."""
    import dataclasses

    from .kineto import ingest_task

    try:
        r = ingest_task(task, reuse_connection=True)
        return {"ok": dataclasses.asdict(r)}
    except TraceFileError as e:
        reason = e.reason
        if reason.startswith("cannot read the file"):
            reason += (f" on Dask worker {_host()}: the trace directory must be on a filesystem every worker "
                       "sees under the same path")
        return {"error": {"path": e.path, "reason": reason}}
    except OSError as e:  # the staging directory: not writable there
        return {"error": {"path": task["path"], "reason": f"Dask worker {_host()} cannot write the store's staging "
                          f"directory {task['stage']} ({e.strerror}); the store must be on a filesystem shared by "
                          "the client and every worker"}}
    except Exception as e:  # a bug: report it with the file
        return {"error": {"path": task["path"], "reason": f"internal error on Dask worker {_host()} "
                          f"{type(e).__name__}: {e}"}}


def _host() -> str:
    import socket

    return socket.gethostname()


@contextlib.contextmanager
def dask_client(executor: Executor, otherwise: str = "use --executor local"):
    """A client of the Dask cluster at executor.address, closed on leaving; a missing client library or an
    unreachable scheduler is the user's error, naming --executor and what to do (`otherwise`: the alternative)."""
    where = f"--executor {executor}"
    try:
        from distributed import Client
    except ImportError:
        raise TracekitError(f"{where}: the Dask client is not installed; pip install 'tracekit[dask]' "
                            f"(or {otherwise})") from None
    try:
        client = Client(executor.address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise TracekitError(f"{where}: cannot reach the Dask scheduler at {executor.address} ({e}); start one "
                            f"(`dask scheduler`, `dask worker HOST:PORT`) or {otherwise}") from None
    try:
        yield client
    finally:
        client.close()


def run_dask(executor: Executor, tasks: list[dict], on_done: Callable[[str, Callable[[], FileResult]], None]) -> None:
    """Run tasks on the Dask cluster at executor.address; on_done(source, get_result) as each finishes
    (get_result raises TraceFileError for a bad file)."""
    with dask_client(executor) as client:
        from distributed import as_completed, wait

        with client.as_current():  # as_completed / wait look for "the current client"
            _submit_all(client, executor, tasks, on_done, as_completed, wait)


def _submit_all(client, executor: Executor, tasks, on_done, as_completed, wait) -> None:
    where = f"--executor {executor}"
    if not client.scheduler_info().get("workers"):
        try:
            client.wait_for_workers(1, timeout=30)
        except (TimeoutError, OSError):
            raise TracekitError(f"{where}: the scheduler has no workers; start some with "
                                f"`dask worker {executor.address}`") from None
    # pure=False: a file changed since an earlier ingest must be read again, not served from a cache
    futures = {client.submit(dask_task, t, pure=False, key=f"tracekit-ingest-{os.path.basename(t['stage'])}-"
                             f"{abs(hash(t['stage'])):x}"): t for t in tasks}
    try:
        for fut in as_completed(futures):
            task = futures[fut]
            try:
                reply = fut.result()
            except Exception as e:  # the worker died (KilledWorker) or the task could not run there
                reply = {"error": {"path": task["path"], "reason": f"the Dask task failed ({type(e).__name__}: "
                                   f"{e}); is tracekit installed on every worker?"}}
            on_done(task["source"], result_getter(reply, _staged_here(task)))
    finally:
        # on an error, let the tasks already running finish before the caller removes the staging
        # directory they write into (as the local pool does); the queued ones are cancelled
        pending = [f for f in futures if not f.done()]
        if pending:
            try:
                running = {k for keys in client.processing().values() for k in keys}
            except Exception:  # the scheduler is gone: nothing more to wait for
                running = set()
            client.cancel([f for f in pending if f.key not in running])
            wait([f for f in pending if f.key in running], timeout=120)


def result_getter(reply: dict, check: Callable[[FileResult], None] | None = None) -> Callable[[], FileResult]:
    """An executor's reply (`{"ok": FileResult fields}` or `{"error": {"path", "reason"}}`) -> the get_result
    that on_done receives: it raises TraceFileError for a bad file, else returns the FileResult, once
    `check` (when given) has accepted it."""
    def get() -> FileResult:
        if "error" in reply:
            raise TraceFileError(reply["error"]["path"], reply["error"]["reason"])
        r = FileResult(**reply["ok"])
        if check is not None:
            check(r)
        return r

    return get


def _staged_here(task: dict) -> Callable[[FileResult], None]:
    """A Dask task's result check: every file the worker staged must be visible on this machine."""
    def check(r: FileResult) -> None:
        missing = [p for ps in r.staged.values() for p in ps if not os.path.exists(p)]
        if missing:
            raise TracekitError(
                f"--executor dask: a worker wrote {missing[0]}, which this machine cannot see; the store "
                f"({os.path.dirname(os.path.dirname(os.path.dirname(task['stage'])))}) must be on a filesystem "
                "shared by the client and every worker, under the same path")

    return check
