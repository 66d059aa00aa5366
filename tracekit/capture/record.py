"""`tracekit record`: run a training command and gather what its ranks wrote into one directory.

The ranks find the directory through $TRACEKIT_OUT_DIR, which `tracekit.capture.profile()` uses
when it is given no directory. They write into a hidden staging folder (ingest ignores it), and
the files are moved up when the command ends, whatever its exit code, so a failed job keeps the
traces its ranks managed to write.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from ..errors import TracekitError
from .session import ENV_OUT_DIR

STAGING = ".tracekit-record"


@dataclasses.dataclass
class RecordResult:
    out_dir: str
    returncode: int
    gathered: list[str]       # file names now in out_dir
    left_in_staging: list[str]  # name clashes, kept rather than overwritten


def is_capture_file(name: str) -> bool:
    return name == "run.json" or (name.startswith("rank") and name.endswith((".trace.json.gz", ".trace.json", ".fr.json")))


def record(argv: list[str], out_dir: str, env: dict[str, str] | None = None, force: bool = False) -> RecordResult:
    """Run `argv` with $TRACEKIT_OUT_DIR set; gather rank files into `out_dir`; return the exit code."""
    if not argv:
        raise TracekitError("record: no command given (put it after --, e.g. tracekit record -- torchrun ...)")
    out_dir = os.path.abspath(out_dir)
    old = [n for n in (os.listdir(out_dir) if os.path.isdir(out_dir) else []) if is_capture_file(n)]
    if old and not force:
        raise TracekitError(f"{out_dir} already holds a capture ({', '.join(sorted(old)[:3])} ...); "
                            f"choose another --out or pass --force to replace it")
    for name in old:  # a smaller rerun must not leave an earlier job's ranks behind
        os.remove(os.path.join(out_dir, name))
    staging = os.path.join(out_dir, STAGING)
    try:
        os.makedirs(staging, exist_ok=True)
    except OSError as e:
        raise TracekitError(f"{out_dir}: cannot create the output directory ({e.strerror})") from None
    child_env = {**os.environ, **(env or {}), ENV_OUT_DIR: staging}
    try:
        rc = subprocess.call(argv, env=child_env)
    except FileNotFoundError:
        raise TracekitError(f"record: command not found: {argv[0]}") from None
    except PermissionError:
        raise TracekitError(f"record: command is not executable: {argv[0]}") from None
    except KeyboardInterrupt:
        rc = 130  # the ranks got the same SIGINT; still keep what they wrote
    gathered, clashes = _gather(staging, out_dir)
    return RecordResult(out_dir, rc, gathered, clashes)


def _gather(staging: str, out_dir: str) -> tuple[list[str], list[str]]:
    gathered, clashes = [], []
    for root, _dirs, files in os.walk(staging):
        for name in sorted(files):
            if not is_capture_file(name):
                continue
            src, dst = os.path.join(root, name), os.path.join(out_dir, name)
            if name in gathered:  # two ranks' folders with the same file name: keep both, move one
                clashes.append(os.path.relpath(src, out_dir))
                continue
            os.replace(src, dst)
            gathered.append(name)
    # Partial files of ranks that died stay only while they might be inspected: staging keeps them.
    if not any(files for _r, _d, files in os.walk(staging)):
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(gathered), clashes
