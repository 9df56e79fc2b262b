"""Submit a prepared run folder as a job, through submitit, and learn how it ended.

Every kind of work (a single run, a study trial, a promoted run) goes through here so that the
launcher profiles (local processes now, SLURM on the same path) stay one layer. A job's body
never raises for a failed run: it returns a RunOutcome whose `reason` is the one-line cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import submitit

from abtune.errors import AbtuneError
from abtune.launch import local

JOBS_DIR = "jobs"
DEFAULT_TIMEOUT_MIN = 24 * 60


@dataclass(frozen=True)
class RunOutcome:
    ok: bool
    reason: str | None = None
    exit_code: int = 0


def run_local_ranks(run_dir: str, nproc: int, ranks_per_node: int, resume: bool) -> RunOutcome:
    """The body of a local job: start the ranks as processes on this machine and wait for them."""
    try:
        local.launch(Path(run_dir), nproc, ranks_per_node, resume=resume)
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


def submit_local(run_dir: Path, nproc: int, ranks_per_node: int, *, resume: bool = False,
                 timeout_min: int = DEFAULT_TIMEOUT_MIN) -> submitit.Job[RunOutcome]:
    """One local job (a child process that starts `nproc` ranks); its logs go to RUN_DIR/jobs/."""
    executor = submitit.LocalExecutor(folder=run_dir / JOBS_DIR)
    executor.update_parameters(timeout_min=timeout_min, tasks_per_node=1, nodes=1)
    return executor.submit(run_local_ranks, str(run_dir), nproc, ranks_per_node, resume)
