"""Which `study run` owns a RUNNING trial, and whether it is still alive.

Every worker stamps its trials with its host, process id and process start time, and refreshes a
heartbeat while they run. A trial is stale when its worker is gone: on the same host the process
is checked directly (a killed worker is noticed at once); on another host, when its heartbeat is
older than `retries.stale_after_s`. This works on every storage, journal files included, which
have no heartbeat of their own in Optuna.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

WORKER_ATTR = "abtune:worker"
HEARTBEAT_ATTR = "abtune:heartbeat"


def process_start(pid: int) -> str | None:
    """The kernel's start time of a process (Linux), which tells a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def this_worker() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def _alive_here(worker: dict[str, Any]) -> bool:
    pid = int(worker["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = process_start(pid)
    return worker.get("start") is None or started is None or started == worker["start"]


def is_stale(trial: FrozenTrial, stale_after_s: float, now: float | None = None) -> bool:
    worker = trial.system_attrs.get(WORKER_ATTR)
    if worker and worker.get("host") == socket.gethostname():
        return not _alive_here(worker)
    start = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    beat = float(trial.system_attrs.get(HEARTBEAT_ATTR, start))
    return (now or time.time()) - beat > stale_after_s


def describe(worker: dict[str, Any] | None) -> str:
    return f"{worker['host']}:{worker['pid']}" if worker else "an unknown worker"
