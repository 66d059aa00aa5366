"""Local executor: a pool of `python -m tracekit.ingest` worker processes.

Why not multiprocessing: its spawn start method re-runs the caller's __main__
(scripts without a main guard, notebooks), and fork is unsafe once DuckDB has
started threads in the parent. Plain subprocesses speaking one JSON object per
line have neither problem, and die cleanly with their parent.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable

import msgspec

from ..errors import TraceFileError
from .executor import result_getter
from .kineto import FileResult, ingest_task


def _serve() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        task = msgspec.json.decode(line)
        try:
            r = ingest_task(task, reuse_connection=True)
            reply = {"ok": dataclasses.asdict(r)}
        except TraceFileError as e:
            reply = {"error": {"path": e.path, "reason": e.reason}}
        except Exception as e:  # a bug: report it with the file, keep serving
            reply = {"error": {"path": task["path"], "reason": f"internal error {type(e).__name__}: {e}"}}
        out.write(msgspec.json.encode(reply) + b"\n")
        out.flush()


def run_pool(tasks: list[dict], jobs: int, on_done: Callable[[str, Callable[[], FileResult]], None]) -> None:
    """Run tasks on `jobs` worker processes; call on_done(source, get_result)
    for each as it finishes (get_result raises TraceFileError for a bad file)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = [subprocess.Popen([sys.executable, "-m", "tracekit.ingest"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env) for _ in range(jobs)]
    pending = list(tasks)
    busy: dict[int, dict] = {}
    try:
        import selectors

        sel = selectors.DefaultSelector()
        for i, p in enumerate(procs):
            sel.register(p.stdout, selectors.EVENT_READ, i)

        def feed(i: int) -> None:
            if pending:
                task = pending.pop(0)
                busy[i] = task
                procs[i].stdin.write(msgspec.json.encode(task) + b"\n")
                procs[i].stdin.flush()

        for i in range(len(procs)):
            feed(i)
        while busy:
            for key, _ in sel.select():
                i = key.data
                line = procs[i].stdout.readline()
                task = busy.pop(i)
                if not line:
                    raise TraceFileError(task["path"], "the ingest worker died (out of memory?); try --jobs 1")
                reply = msgspec.json.decode(line)
                on_done(task["source"], result_getter(reply))
                feed(i)
    finally:
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()

