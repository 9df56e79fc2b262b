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
from abtune.launch.pids import process_alive, process_start

WORKER_JOB_KEY = "slurm_job"  # in WORKER_ATTR: the batch job a launched worker runs in
WORKER_JOB_KIND = "slurm"  # the launcher kind of that job: the one whose workers `study launch` submits


def slurm_job_id() -> str | None:
    """The SLURM job this process runs in, as squeue shows it (`ARRAY_TASK` for an array task)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def this_worker() -> dict[str, Any]:
    worker: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}
    job = slurm_job_id()
    if job:
        worker[WORKER_JOB_KEY] = job  # a requeued worker job is the same worker: it re-attaches its trial
    return worker


def same_slurm_job(trial: FrozenTrial, worker: dict[str, Any]) -> bool:
    """The trial belongs to an earlier run of this very SLURM job (a worker requeued after its time limit)."""
    owner = owner_of(trial) or {}
    return bool(worker.get(WORKER_JOB_KEY)) and owner.get(WORKER_JOB_KEY) == worker[WORKER_JOB_KEY] \
        and owner.get("pid") != worker["pid"]


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
    job = f" (SLURM job {worker['slurm_job']})" if worker.get("slurm_job") else ""
    return f"{worker['host']}:{worker['pid']}{job}"
