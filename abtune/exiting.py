"""Ending a process without Python's finalization.

Once its work is done, an interpreter that imported torch, torchvision and MLflow spends 1-2 s of CPU finalizing:
tearing down thousands of modules and the objects they hold. Nothing a process leaves behind needs that, so
abtune's processes skip it: they flush what they print and end with os._exit.

A rank skips Python's exit handlers too (training/worker.py says why: a gloo thread finishing after its last
collective). The `abtune` command runs them first, as a normal exit does (MLflow's, and weakref finalizers such as
tempfile's, run there), and skips only the teardown after them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn


def exit_without_finalizing(code: int) -> NoReturn:
    """End now: log handlers closed, standard streams flushed, no exit handler run, no finalization."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):  # the reader left, or it is closed: nothing to deliver
            stream.flush()
    os._exit(code)


def exit_after_handlers(code: int) -> NoReturn:
    """End as Python's own exit begins, without the teardown that follows: threads that must finish are
    joined and every exit handler runs, in the order and way the interpreter's shutdown does them (CPython's
    threading._shutdown and atexit._run_exitfuncs), then exit_without_finalizing."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    exit_without_finalizing(code)
