"""The Grid Engine launcher: one qsub job per run, its ranks started on the job's host by ranks.py.

The job script is written by `job_script`, for `--dry-run` and for the real submission alike. The job
writes its outcome to RUN_DIR/jobs/gridengine-JOB_ID.result.json; a job that ends without one (qdel,
h_rt, a killed host) is described from its accounting record (qacct).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import cloudpickle

from abtune.errors import ConfigError
from abtune.launch.base import (
    DEFAULT_TIMEOUT_MIN,
    JOBS_DIR,
    Job,
    JobQueue,
    JobVariables,
    Launcher,
    Layout,
    exported,
)
from abtune.launch.gridengine import commands
from abtune.launch.gridengine.profile import GridEngineProfile
from abtune.launch.outcome import RunOutcome, disk_full, recorded_failure

POLL_SECONDS = 1.0
ACCOUNTING_WAIT_S = 120.0  # how long a job that left the queue without a result may lack its qacct record


def result_path(run_dir: Path, job_id: str) -> Path:
    """Where the job's ranks.py leaves the run's outcome."""
    return run_dir.absolute() / JOBS_DIR / f"gridengine-{job_id}.result.json"


def write_result(path: Path, outcome: RunOutcome) -> None:
    """Whole or not at all: the driver may read it at any moment."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"ok": outcome.ok, "reason": outcome.reason, "exit_code": outcome.exit_code}))
    partial.replace(path)


def read_result(path: Path) -> RunOutcome | None:
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return RunOutcome(bool(raw["ok"]), raw.get("reason"), int(raw.get("exit_code", 0)))


def job_name(run_dir: Path) -> str:
    return f"abtune-{run_dir.absolute().name}"


def job_script(run_dir: Path, layout: Layout, profile: GridEngineProfile, name: str | None = None,
               resume: bool = False) -> str:
    """The script qsub gets: options as `#$` lines, the profile's setup, then the ranks (ranks.py)."""
    limits = {**({"h_rt": profile.hard_run_time} if profile.hard_run_time else {}), **profile.resources}
    options = [f"-pe {profile.parallel_environment} {layout.world_size}",
               *(f"-l {key}={value}" for key, value in limits.items()), *profile.qsub]
    command = (f"-m abtune.launch.gridengine.ranks {shlex.quote(str(run_dir.absolute()))} --ranks {layout.world_size}"
               + (" --resume" if resume else ""))
    return _script(run_dir.absolute() / JOBS_DIR, profile, name or job_name(run_dir), options, command)


def after_script(held_job: str, pickled_body: Path, profile: GridEngineProfile, name: str) -> str:
    """A one-slot job that runs a pickled body once `held_job` has left the queue, however it ended."""
    command = f"-m abtune.launch.gridengine.after {shlex.quote(str(pickled_body))}"
    return _script(pickled_body.parent, profile, name, [f"-hold_jid {held_job}"], command)


def _script(folder: Path, profile: GridEngineProfile, name: str, options: list[str], command: str) -> str:
    workdir = shlex.quote(str((profile.workdir or Path.cwd()).absolute()))
    logs = f"{shlex.quote(str(folder))}/gridengine-$JOB_ID"
    options = ["-S /bin/bash", f"-N {name}", f"-wd {workdir}", f"-o {logs}.out", f"-e {logs}.err", *options,
               "-V", "-r n", *([f"-q {profile.queue}"] if profile.queue else []),
               *([f"-P {profile.project}"] if profile.project else [])]
    python = profile.python or shlex.quote(sys.executable)
    path = [f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}"] if os.environ.get("PYTHONPATH") else []
    return "\n".join(["#!/bin/bash", *(f"#$ {option}" for option in options), *path, *profile.setup,
                      f"exec {python} -u {command}", ""])


class GridEngineJob(Job):
    """A Grid Engine job of the run's ranks; it keeps running when abtune stops following it."""

    kind = "gridengine"
    label = "Grid Engine job"
    outlives_driver = True
    followable = True

    def __init__(self, job_id: str, run_dir: Path) -> None:
        super().__init__(job_id, run_dir)
        self._state = "PENDING"
        self._left_queue_at: float | None = None

    @classmethod
    def reattach(cls, record: Any, run_dir: Path) -> GridEngineJob:
        """Any job of the cell can be followed from any of its submit hosts: qstat and qacct know it."""
        return cls(str(record), run_dir)

    def poll(self) -> RunOutcome | None:
        letters = commands.queue_states().get(self.job_id)
        self._state = "DONE" if letters is None else commands.state_word(letters)
        result = read_result(result_path(self.run_dir, self.job_id))
        if result is not None:
            return result
        if letters is not None:
            return self._never_starts() if "E" in letters else None
        return self._without_result()

    def _never_starts(self) -> RunOutcome:
        """A job in error state (Eqw: its working directory or output folder is missing, say) waits forever."""
        reason = commands.error_reason(self.job_id)
        commands.qdel([self.job_id])
        return RunOutcome(False, f"{self.describe()} could not start: {reason}", 1, never_started=True)

    def _without_result(self) -> RunOutcome | None:
        """The job left the queue and its ranks wrote no result: qdel, h_rt, a crash. qacct says which."""
        record = commands.accounting(self.job_id)
        if record is None:
            self._left_queue_at = self._left_queue_at or time.monotonic()
            if time.monotonic() - self._left_queue_at < ACCOUNTING_WAIT_S:
                return None  # the qmaster writes accounting every flush_time (15 s by default)
            return RunOutcome(False, f"{self.describe()} left the queue with no result and no accounting record", 1)
        result = read_result(result_path(self.run_dir, self.job_id))  # written just before it left the queue
        if result is not None:
            return result
        cause = recorded_failure(self.run_dir, crashes=False) or disk_full(self.run_dir, self._logs())
        return RunOutcome(False, cause or f"{self.describe()} ended without a result: {_end_of(record)}", 1)

    def _logs(self) -> list[Path]:
        folder = self.run_dir.absolute() / JOBS_DIR
        return [folder / f"gridengine-{self.job_id}.{suffix}" for suffix in ("out", "err")]

    def cancel(self) -> None:
        commands.qdel([self.job_id])

    def gone(self) -> bool:
        return self.job_id not in commands.queue_states()

    @property
    def state(self) -> str:
        return self._state

    def watch_command(self) -> str:
        return f"qstat -j {self.job_id}"

    def cancel_command(self) -> str:
        return f"qdel {self.job_id}"

    def follow(self, out: TextIO = sys.stdout, poll_s: float = POLL_SECONDS) -> RunOutcome:
        from abtune.launch.follow import follow

        return follow(self, out, poll_s)


def _end_of(record: dict[str, str]) -> str:
    """qacct's `failed` and `exit_status` in words: `failed 100 : assumedly after job` and exit status 137
    is a job killed by SIGKILL (qdel, h_rt)."""
    failed, status = record.get("failed", "?"), record.get("exit_status", "?").split()[0]
    if failed.startswith("100") or status == "137":
        return f"killed (qdel, or a limit such as h_rt; exit status {status})"
    if not failed.startswith("0"):
        return f"failed ({failed}; exit status {status})"
    return f"exit status {status}"


class GridEngineLauncher(Launcher, JobQueue):
    """One Grid Engine job of `slots` slots per run, all on one host; every slot is one rank."""

    kind = "gridengine"
    profile_type = GridEngineProfile
    job_type = GridEngineJob
    poll_s = POLL_SECONDS
    jobs_outlive_driver = True
    job_variables = JobVariables(job_id="JOB_ID", node_name="HOSTNAME")
    profile: GridEngineProfile

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        if nproc is not None or ranks_per_node is not None:
            raise ConfigError("--nproc and --ranks-per-node are for --launcher local; set slots in the profile")
        return Layout(1, self.profile.slots)

    def trial_layout(self, nproc: int, ranks_per_node: int, measures_inter_node: bool) -> Layout:
        """The profile wins over the study's `layout` (which is for local runs)."""
        if measures_inter_node:
            raise ConfigError("launcher profile: a Grid Engine job runs on one host, but this study measures "
                              "inter-node traffic; use a launcher whose runs span several nodes")
        return self.layout(None, None)

    def resized(self, layout: Layout) -> GridEngineLauncher:
        return GridEngineLauncher(self.profile.model_copy(update={"slots": layout.world_size}))

    def batch_script(self, run_dir: Path, layout: Layout, job_name: str | None = None) -> str:
        return job_script(run_dir, layout, self.profile, job_name)

    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        """qsub (the profile's h_rt, not `timeout_min`) of the script in RUN_DIR/jobs/; it returns at once."""
        folder = run_dir.absolute() / JOBS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "gridengine.sh"
        script.write_text(job_script(run_dir, layout, self.profile, job_name, resume))
        with exported(env):
            return GridEngineJob(commands.qsub(script), run_dir)

    def after(self, job: Job, body: Callable[[], Any], folder: Path) -> Job:
        """A one-slot job that runs `body` once `job` has left the queue, however it ended (qsub -hold_jid)."""
        folder.mkdir(parents=True, exist_ok=True)
        pickled = folder.absolute() / f"gridengine-after-{job.job_id}.pkl"
        pickled.write_bytes(cloudpickle.dumps(body))
        script = folder / f"gridengine-after-{job.job_id}.sh"
        script.write_text(after_script(job.job_id, pickled, self.profile, f"{job_name(job.run_dir)}-after"))
        return GridEngineJob(commands.qsub(script), job.run_dir)

    @classmethod
    def queued(cls, job_ids: Sequence[str]) -> list[str]:
        if not job_ids:
            return []
        states = commands.queue_states()
        return [job for job in job_ids if job in states]

    @classmethod
    def cancel(cls, job_ids: Sequence[str]) -> None:  # type: ignore[override]
        commands.qdel(list(job_ids))
