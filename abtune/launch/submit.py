"""Submit a prepared run folder as a job, through submitit, and learn how it ended.

Every kind of work (a single run, a study trial, a promoted run) goes through here so that the
launcher profiles (local processes, in-process debug, SLURM) stay one layer. A job's body never
raises for a failed run on the local launchers: it returns a RunOutcome whose `reason` is the
one-line cause; on SLURM, `outcome()` builds it from the SLURM state and the failure files.

    job = submit_run(run_dir, layout, profile)     # returns at once (debug: runs on .result())
    record(job.job_id)                             # e.g. in a trial's attributes
    ...
    job = attach(job_id, job_folder(run_dir))      # later, from any process on the login node
    result = wait(job, run_dir)                    # or poll outcome(job, run_dir) -> None while running
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import submitit

from abtune.errors import AbtuneError
from abtune.launch import local, slurm
from abtune.launch.outcome import RunOutcome
from abtune.launch.profiles import DebugProfile, FabricProfile, Layout, LocalProfile, Profile, SlurmProfile
from abtune.launch.slurm import attach, job_folder

__all__ = ["RunOutcome", "attach", "job_folder", "outcome", "submit_local", "submit_run", "wait"]

JOBS_DIR = slurm.JOBS_DIR
DEFAULT_TIMEOUT_MIN = 24 * 60
POLL_SECONDS = 2.0


def run_local_ranks(run_dir: str, nproc: int, ranks_per_node: int, resume: bool,
                    fabric: FabricProfile | None = None) -> RunOutcome:
    """The body of a local job: start the ranks as processes on this machine and wait for them."""
    try:
        local.launch(Path(run_dir), nproc, ranks_per_node, resume=resume, fabric=fabric)
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


def run_in_process(run_dir: str, resume: bool) -> RunOutcome:
    """The body of a debug job: rank 0 of 1 in this very process (breakpoints work; crashes open pdb)."""
    from abtune.training.worker import run_rank

    port = local.free_port()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", ABTUNE_NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        run_rank(Path(run_dir), resume)
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


def submit_local(run_dir: Path, nproc: int, ranks_per_node: int, *, resume: bool = False,
                 timeout_min: int = DEFAULT_TIMEOUT_MIN, fabric: FabricProfile | None = None) -> submitit.Job[RunOutcome]:
    """One local job (a child process that starts `nproc` ranks, on an emulated `fabric` of their own if
    given); its logs go to RUN_DIR/jobs/."""
    executor = submitit.LocalExecutor(folder=run_dir / JOBS_DIR)
    executor.update_parameters(timeout_min=timeout_min, tasks_per_node=1, nodes=1)
    return executor.submit(run_local_ranks, str(run_dir), nproc, ranks_per_node, resume, fabric)


def submit_run(run_dir: Path, layout: Layout, profile: Profile, *, resume: bool = False,
               job_name: str | None = None) -> submitit.Job[RunOutcome]:
    """Start the run prepared in `run_dir` (config.yaml written) on `layout.world_size` ranks
    (SLURM: as job `job_name`, default abtune-FOLDER)."""
    if isinstance(profile, SlurmProfile):
        return slurm.submit(run_dir, layout, profile, resume, job_name)
    if isinstance(profile, DebugProfile):
        executor = submitit.DebugExecutor(folder=run_dir / JOBS_DIR)
        return executor.submit(run_in_process, str(run_dir), resume)
    assert isinstance(profile, LocalProfile)
    return submit_local(run_dir, layout.world_size, layout.ranks_per_node, resume=resume, fabric=profile.fabric)


def outcome(job: submitit.Job[RunOutcome], run_dir: Path) -> RunOutcome | None:
    """How the job ended, or None while it is queued or running."""
    if isinstance(job, submitit.SlurmJob):
        return slurm.outcome(job, run_dir)
    if not job.done():
        return None
    try:
        return job.result()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as error:
        return RunOutcome(False, f"job {job.job_id} failed: {_last_line(str(error))}", 1)


def wait(job: submitit.Job[RunOutcome], run_dir: Path, poll_s: float = POLL_SECONDS) -> RunOutcome:
    """Block until the job ends (SLURM: also through requeues); see `outcome`."""
    while (result := outcome(job, run_dir)) is None:
        time.sleep(poll_s)
    return result


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return lines[-1] if lines else "no message"
