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
from typing import Any

from optuna.trial import FrozenTrial

from abtune.attrs import HEARTBEAT_ATTR, WORKER_ATTR, stored
from abtune.launch.launchers import this_worker_job, worker_job
from abtune.launch.pids import process_alive, process_start


def this_worker() -> dict[str, Any]:
    """The stamp of this worker: host, process, its start, and the job it runs in where it is one (a
    requeued worker job is the same worker: it re-attaches its trial)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()), **this_worker_job()}


def same_worker_job(trial: FrozenTrial, worker: dict[str, Any]) -> bool:
    """The trial belongs to an earlier run of this very worker job (a worker requeued after its time limit)."""
    owner = owner_of(trial) or {}
    mine = worker_job(worker)
    return mine is not None and worker_job(owner) == mine and owner.get("pid") != worker["pid"]


def owner_of(trial: FrozenTrial) -> dict[str, Any] | None:
    """The worker that follows the trial (as it stamped it: `this_worker()`), None before any did."""
    return stored(trial.system_attrs, WORKER_ATTR)


def is_stale(trial: FrozenTrial, stale_after_s: float, now: float | None = None) -> bool:
    worker = owner_of(trial)
    if worker and worker.get("host") == socket.gethostname():
        return not process_alive(worker)
    start = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    beat = float(stored(trial.system_attrs, HEARTBEAT_ATTR, start))
    return (now or time.time()) - beat > stale_after_s


def describe(worker: dict[str, Any] | None) -> str:
    if not worker:
        return "an unknown worker"
    launched = worker_job(worker)
    job = f" ({launched[0].job_type.label} {launched[1]})" if launched else ""
    return f"{worker['host']}:{worker['pid']}{job}"
