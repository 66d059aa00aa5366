"""`profile`: torch.profiler around a rank's training loop, plus flight recorder and run.json."""
from __future__ import annotations

import os
import time
import warnings

from ..errors import TracekitError
from . import flight_recorder, manifest
from ._torch import dist_rank_world, require_torch

ENV_OUT_DIR = "TRACEKIT_OUT_DIR"


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json.gz"


class profile:  # noqa: N801 - used like torch.profiler.profile
    """Profile one rank of a (torch.distributed) training job.

    Use it around the training loop and call `step()` once per iteration::

        with tracekit.capture.profile("runs/job42", steps=3, warmup=1, parallel={"dp": 4}) as prof:
            for batch in loader:
                train_step(batch)
                prof.step()

    Iterations 1..warmup run under a warming profiler, the next `steps` are recorded, and the rest
    run unprofiled (they are still timed). Every iteration is timed with a wall clock outside the
    profiler. On exit each rank writes `rank<R>.trace.json.gz` and `rank<R>.fr.json`, and rank 0
    writes `run.json`. Leave the block before `destroy_process_group()`: rank 0 gathers the
    manifest over the process group. A DDP job on gloo should end each rank with
    `tracekit.capture.end_process()` after `destroy_process_group()` (capture/teardown.py says why).

    `out_dir` defaults to $TRACEKIT_OUT_DIR (set by `tracekit record`).
    """

    def __init__(self, out_dir: str | os.PathLike | None = None, *, steps: int = 3, warmup: int = 1,
                 wait: int = 0, record_shapes: bool = True, profile_memory: bool = False,
                 with_stack: bool = False, parallel: dict | None = None, flight_recorder_entries: int = 2000,
                 extra: dict | None = None):
        out_dir = out_dir if out_dir is not None else os.environ.get(ENV_OUT_DIR)
        if not out_dir:
            raise TracekitError(f"profile(): no output directory given and ${ENV_OUT_DIR} is not set")
        if steps < 1 or warmup < 0 or wait < 0:
            raise TracekitError(f"profile(): steps must be >= 1 and warmup, wait >= 0 "
                                f"(got steps={steps}, warmup={warmup}, wait={wait})")
        self.out_dir = os.fspath(out_dir)
        self.steps, self.warmup, self.wait = steps, warmup, wait
        self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
        self.parallel = dict(parallel or {})
        self.extra = dict(extra or {})
        self.fr_entries = flight_recorder_entries
        self.step_times_ns: list[int] = []
        self.trace_path: str | None = None
        self.manifest_path: str | None = None
        self._prof = None
        self._t_ns = 0
        self._cuda = False
        # Before any collective: the recorder sizes its buffer when it first records.
        flight_recorder.enable(self.fr_entries)

    # ---- context manager -------------------------------------------------------------------
    def __enter__(self):
        torch = require_torch()
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except OSError as e:
            raise TracekitError(f"{self.out_dir}: cannot create the output directory ({e.strerror})") from None
        self.rank, self.world_size, self.distributed = dist_rank_world()
        self._cuda = torch.cuda.is_available()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.steps, repeat=1),
            on_trace_ready=self._write_trace,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, with_stack=self.with_stack)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "clears events at the end of each cycle": one cycle here
            self._prof.__enter__()
        self._sync()
        self._t_ns = time.perf_counter_ns()
        return self

    def step(self) -> None:
        """Mark the end of one training iteration."""
        self._sync()
        now = time.perf_counter_ns()
        self.step_times_ns.append(now - self._t_ns)
        if self._prof is not None:
            self._prof.step()
            if len(self.step_times_ns) >= self.wait + self.warmup + self.steps:
                self._stop_profiler()  # later iterations run (and are timed) without profiler overhead
        # Measured after the profiler's own bookkeeping so that it is not charged to the next step.
        self._t_ns = time.perf_counter_ns()

    def __exit__(self, exc_type, exc, tb):
        self._stop_profiler()
        if exc_type is not None:
            return False  # the traces written so far stay; no manifest for a failed job
        fr_path, fr_count, fr_why = flight_recorder.dump(self.out_dir, self.rank)
        if fr_why:
            warnings.warn(f"rank {self.rank}: {fr_why}", stacklevel=2)
        first = self.wait + self.warmup
        profiled = list(range(first, min(first + self.steps, len(self.step_times_ns))))
        info = manifest.local_info(self.rank, self.step_times_ns, profiled,
                                   os.path.basename(self.trace_path) if self.trace_path else None,
                                   os.path.basename(fr_path) if fr_path else None, fr_count)
        # The process group may have come up inside the block (profile entered before init).
        _, self.world_size, self.distributed = dist_rank_world()
        infos = manifest.gather(info, self.world_size, self.distributed)
        if infos is not None:
            backend = None
            if self.distributed:
                backend = str(require_torch().distributed.get_backend())
            doc = manifest.build(infos, self.world_size, backend, self.parallel, self.steps, self.warmup,
                                 self.extra)
            self.manifest_path = manifest.write(self.out_dir, doc)
        return False

    # ---- internals -------------------------------------------------------------------------
    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)

    def _write_trace(self, prof) -> None:
        final = os.path.join(self.out_dir, trace_name(self.rank))
        # Hidden and ending in .gz: torch gzips by suffix, and ingest ignores dot-files.
        tmp = os.path.join(self.out_dir, f".rank{self.rank}.partial.json.gz")
        prof.export_chrome_trace(tmp)
        os.replace(tmp, final)
        self.trace_path = final

    def _sync(self) -> None:
        if self._cuda:
            require_torch().cuda.synchronize()
