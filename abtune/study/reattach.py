"""Following a trial's job from a `study run` other than the one that started it.

A local trial's job (submitit's local job: a controller process, its task, and the ranks) is not a
child of the terminal's process group leader alone: killing `study run` with SIGKILL leaves it
training. Its controller's pid, process start time and host are recorded in the trial
(`local_job`), as a SLURM trial records its job id. A restarted `study run` on the same host then
follows that job to its end and tells its result, instead of failing the trial as stale and
training its parameters a second time. A job that already ended while no runner watched is told
from its result file; only a job that is gone without a result leaves its trial to be failed as
stale (and retried from its checkpoint).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import submitit
from optuna.trial import FrozenTrial

from abtune.launch.slurm import attach, job_folder
from abtune.study import workers

LOCAL_JOB_ATTR = "local_job"
SLURM_JOB_ATTR = "slurm_job_id"


def local_job_record(job: submitit.LocalJob[Any]) -> dict[str, Any]:
    """What identifies a local job from another process on this host: the controller's pid (submitit's
    job id) with its start time (a reused pid is not the job), and its folder (the result file)."""
    pid = int(job.job_id)
    return {"host": socket.gethostname(), "pid": pid, "start": workers.process_start(pid),
            "folder": str(job.paths.folder)}


class LocalJobHere:
    """A local job started by another (dead) process on this host, with the parts of submitit's Job the
    runner uses: done(), result(), cancel(), job_id. Its controller is not our child, so its end is
    seen by the process disappearing, and its result read from its result file."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.job_id = str(record["pid"])
        self._job: submitit.LocalJob[Any] = submitit.LocalJob(folder=Path(record["folder"]), job_id=self.job_id)

    def done(self) -> bool:
        return not workers.process_alive(self.record)

    def has_result(self) -> bool:
        return self._job.paths.result_pickle.exists()

    def result(self) -> Any:
        return self._job.result()

    def cancel(self) -> None:
        """As submitit cancels its own local jobs: SIGINT to the controller, which stops its task and ranks."""
        if not self.done():
            os.kill(int(self.record["pid"]), signal.SIGINT)


def local_job_here(trial: FrozenTrial) -> LocalJobHere | None:
    """The trial's local job if it can be followed from here: on this host, and running or ended with a result."""
    record = trial.user_attrs.get(LOCAL_JOB_ATTR)
    if not record or record.get("host") != socket.gethostname() or not trial.user_attrs.get("run_dir"):
        return None
    job = LocalJobHere(record)
    return job if not job.done() or job.has_result() else None


def job_to_follow(trial: FrozenTrial) -> tuple[Any, str] | None:
    """The job a dead worker's RUNNING trial still has, with how to name it; None when there is none."""
    run_dir = trial.user_attrs.get("run_dir")
    job_id = trial.user_attrs.get(SLURM_JOB_ATTR)
    if job_id and run_dir:
        return attach(job_id, job_folder(Path(run_dir))), f"SLURM job {job_id}"
    local = local_job_here(trial)
    if local is not None:
        return local, f"local job {local.job_id}" + ("" if not local.done() else " (ended; its result is told)")
    return None
