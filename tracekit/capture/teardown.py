"""Ending a rank's process without the interpreter teardown that aborts gloo jobs now and then.

The cause, found with core dumps of the demo trainer (torch 2.13, CPython 3.11): DistributedDataParallel
keeps the gloo ProcessGroup alive after `destroy_process_group()` (its `pt_gloo_runloop` and
`gloo_tcp_loop` threads are still running after destroy and a full `gc.collect()`; without DDP they are
gone), so its worker threads outlive the training code. A worker releases a finished collective's
tensors just after it has signalled completion; when the rank's main thread meanwhile returned and the
interpreter began to finalize, dropping a tensor that a Python object owns needs the GIL, CPython then
ends the worker with `pthread_exit`, and the forced unwind through the work's noexcept destructor calls
`std::terminate`:

    ProcessGroupGloo::runLoop -> ~AsyncAllreduceWork -> ~AsyncWork -> ~vector<Tensor>
      -> TensorImpl::decref_pyobject -> gil_scoped_acquire -> take_gil -> PyThread_exit_thread
      -> pthread_exit -> _Unwind_ForcedUnwind -> std::terminate   "terminate called without an active exception"

It is a race (about 1 run in 30 of the 2-rank demo on a loaded 2-core machine; the rank that sends the
manifest last is the usual victim), and nothing a rank does before it returns closes it: the leaked
group cannot be destroyed, and any last collective's release can fall into the teardown. A rank whose
work is done and whose files are closed therefore leaves with `os._exit` after flushing its output:
there is no interpreter teardown for a worker thread to race with.
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn


def end_process(code: int = 0) -> NoReturn:
    """Flush stdout and stderr, then end the process at once with `code` (no interpreter teardown).

    Call it last in a rank's entry point, after `destroy_process_group()` and after every file the rank
    writes is closed (tracekit.capture.profile closes its trace, dump and run.json before its block ends).
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to flush into
            pass
    os._exit(code)
