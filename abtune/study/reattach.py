"""Following a trial's job from a `study run` other than the one that started it.

A trial records its job as its launcher describes it (`job`: {kind, record, run_id}, launch.launchers.job_entry;
a local job's record names its controller's host, pid, start time and folder), so a restarted `study run` follows that job to
its end and tells its result, instead of failing the trial as stale and training its parameters a
second time. A local job's controller is not a child of the terminal's process group leader alone:
killing `study run` with SIGKILL leaves it training. A job that already ended while no runner
watched is told from its result file; only a job that is gone without a result (or a local job of
another host) leaves its trial to be failed as stale (and retried from its checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from optuna.trial import FrozenTrial

from abtune.attrs import JOB_ATTR, RUN_DIR_ATTR, SEED_JOBS_ATTR
from abtune.launch.base import Job
from abtune.launch.launchers import followed, job_entry, recorded_job
from abtune.launch.outcome import RunOutcome
from abtune.study.repeats import seed_dir


def record_job(trial: object, job: Job, run_id: str | None) -> None:
    """Store what identifies the trial's job (and its MLflow run), for a later runner to follow it."""
    entry = job_entry(job, run_id)
    if entry is not None:
        trial.set_user_attr(JOB_ATTR, entry)  # type: ignore[attr-defined]


def job_to_follow(trial: FrozenTrial) -> Job | None:
    """The job a dead worker's RUNNING trial still has; None when there is none to follow from here.
    A repeated trial's are its seeds' live jobs, as one (what `study stop` cancels)."""
    run_dir = trial.user_attrs.get(RUN_DIR_ATTR)
    if not run_dir:
        return None
    seeds = trial.user_attrs.get(SEED_JOBS_ATTR)
    if seeds:
        jobs = [job for seed, entry in sorted(seeds.items())
                if (job := followed(entry, seed_dir(Path(run_dir), int(seed)))) is not None]
        live = [job for job in jobs if not job.gone()]
        return SeedJobs(live, Path(run_dir)) if live else None
    entry = recorded_job(trial.user_attrs)
    return followed(entry, Path(run_dir)) if entry is not None else None


class SeedJobs(Job):
    """The live seed jobs of a repeated trial another runner started, as one job to cancel."""

    kind = "seeds"
    label = "seed jobs"

    def __init__(self, jobs: list[Job], run_dir: Path) -> None:
        super().__init__(" ".join(job.job_id for job in jobs), run_dir)
        self.jobs = jobs

    def poll(self) -> RunOutcome | None:
        outcomes = [job.poll() for job in self.jobs]
        if any(outcome is None for outcome in outcomes):
            return None
        failed = [outcome for outcome in outcomes if outcome is not None and not outcome.ok]
        return failed[0] if failed else RunOutcome(True)

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    def gone(self) -> bool:
        return all(job.gone() for job in self.jobs)

    def describe(self) -> str:
        return ", ".join(job.describe() for job in self.jobs)
