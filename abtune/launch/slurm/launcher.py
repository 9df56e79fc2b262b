"""The SLURM launcher: one SLURM job of `nodes x tasks_per_node` tasks per run through submitit
(sbatch.py), followed through one shared squeue view (queue.py), its requests checked against what
sinfo tells of the cluster (capacity.py), and the study workers of `abtune study launch` as one job
array of light jobs. Its profile is profile.py's SlurmProfile.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import submitit

from abtune.config import RunConfig
from abtune.errors import ConfigError
from abtune.launch.base import (
    DEFAULT_TIMEOUT_MIN,
    Job,
    Launcher,
    Layout,
    StudyWorkers,
    SubmissionFailed,
    exported,
)
from abtune.launch.outcome import RunOutcome
from abtune.launch.slurm import capacity, queue, sbatch
from abtune.launch.slurm.profile import SlurmProfile


class SlurmJob(Job):
    """A SLURM job of the run's ranks; it keeps running when abtune stops following it."""

    kind = sbatch.KIND
    label = "SLURM job"
    outlives_driver = True
    followable = True
    legacy_attr = "slurm_job_id"

    def __init__(self, job: submitit.Job[RunOutcome], run_dir: Path) -> None:
        super().__init__(str(job.job_id), run_dir)
        self.submitit_job = job
        queue.QUEUE.follow(self.job_id)  # asked about in the same squeue call as every other job followed

    @classmethod
    def reattach(cls, record: Any, run_dir: Path) -> SlurmJob:
        """Any SLURM job can be followed from any host of the cluster: sacct knows it."""
        return cls(queue.attach(str(record), sbatch.job_folder(run_dir)), run_dir)

    def poll(self) -> RunOutcome | None:
        return queue.outcome(self.submitit_job, self.run_dir)

    def cancel(self) -> None:
        self.submitit_job.cancel(check=False)

    def gone(self) -> bool:
        """Out of squeue: sacct may call a cancelled job CANCELLED while its tasks are still ending."""
        return not queue.in_queue(self.job_id)

    @property
    def state(self) -> str:
        return queue.state(self.submitit_job)

    def watch_command(self) -> str:
        return f"squeue -j {self.job_id}"

    def cancel_command(self) -> str:
        return f"scancel {self.job_id}"

    def follow(self, out: TextIO = sys.stdout, poll_s: float = sbatch.POLL_SECONDS) -> RunOutcome:
        from abtune.launch.follow import follow

        return follow(self, out, poll_s)


class SlurmLauncher(Launcher, StudyWorkers):
    """One SLURM job of `nodes x tasks_per_node` tasks per run (the profile's layout); every task is one rank."""

    kind = sbatch.KIND
    profile_type = SlurmProfile
    job_type = SlurmJob
    jobs_outlive_driver = True
    worker_key = "slurm_job"
    job_variables = sbatch.JOB_VARIABLES
    profile: SlurmProfile

    def __init__(self, profile: SlurmProfile) -> None:
        super().__init__(profile)
        self.poll_s = sbatch.poll_interval(profile)  # one squeue per poll for all jobs (queue.QueueView)

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        if nproc is not None or ranks_per_node is not None:
            raise ConfigError("--nproc and --ranks-per-node are for --launcher local; "
                              "set nodes and tasks_per_node in the profile")
        return Layout(self.profile.nodes, self.profile.tasks_per_node)

    def trial_layout(self, nproc: int, ranks_per_node: int, measures_inter_node: bool) -> Layout:
        """The profile wins over the study's `layout` (which is for local runs)."""
        if measures_inter_node and self.profile.nodes < 2:
            raise ConfigError("launcher profile: nodes is 1, but this study measures inter-node traffic; "
                              "use a profile with nodes >= 2")
        return self.layout(None, None)

    def resized(self, layout: Layout) -> SlurmLauncher:
        return SlurmLauncher(self.profile.model_copy(update={"nodes": layout.nodes,
                                                             "tasks_per_node": layout.ranks_per_node}))

    def batch_script(self, run_dir: Path, layout: Layout, job_name: str | None = None) -> str:
        return sbatch.sbatch_script(run_dir, layout, self.profile, job_name)

    def check_request(self, layout: Layout, config: RunConfig | None = None) -> str | None:
        """What sinfo tells of the partition: a job it can never hold is refused (capacity.check_request)."""
        return capacity.check_request(self.profile, layout)

    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        """sbatch (the profile's time limit, not `timeout_min`); from inside a job as from a login node. A
        job the cluster can never start is refused as sbatch refuses one (SubmissionFailed)."""
        try:
            self.check_request(layout)
        except ConfigError as error:
            raise SubmissionFailed(str(error)) from None
        with sbatch.nested_submission(), exported(env):
            return SlurmJob(sbatch.submit(run_dir, layout, self.profile, resume, job_name), run_dir)

    def after(self, job: Job, body: Callable[[], Any], folder: Path) -> Job:
        """A light one-task job that starts when `job` leaves the queue (sbatch --dependency=afterany)."""
        with sbatch.nested_submission():
            return SlurmJob(sbatch.submit_after(job.job_id, folder, self.profile, body, f"{_job_name(job)}-after"),
                            job.run_dir)

    # --- study workers: one job array of light jobs (see abtune/study/launch.py) ---------------
    def submit_workers(self, folder: Path, body: Callable[[], Any], count: int, job_name: str) -> list[str]:
        jobs = sbatch.submit_array(folder, sbatch.WORKER_LAYOUT, sbatch.worker_profile(self.profile), [body] * count,
                                   job_name)
        return [job.job_id for job in jobs]

    def workers_script(self, folder: Path, count: int, job_name: str) -> str:
        script = sbatch.array_script(folder, sbatch.WORKER_LAYOUT, sbatch.worker_profile(self.profile), count, job_name)
        return f"# {count} worker(s): one job array, 1 task each\n" + script

    def check_worker_room(self, layout: Layout, count: int, rerun: str) -> str | None:
        """Workers sit on the cluster's nodes as long as they run: refuse a layout where they can hold
        every node a trial needs (capacity.py). Array tasks beyond `array_parallelism` wait, holding nothing."""
        return capacity.check_workers_leave_room(self.profile, sbatch.worker_profile(self.profile), layout,
                                                 min(count, self.profile.array_parallelism), rerun)

    def watch_workers_command(self, job_name: str) -> str:
        return f"squeue --name {job_name}"

    @classmethod
    def job_environment(cls) -> str | None:
        """The SLURM job this process runs in, as squeue shows it (`ARRAY_TASK` for an array task)."""
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")

    @classmethod
    def rerun_args(cls, source: str | None, nproc: int, ranks_per_node: int) -> list[str]:
        """The profile sets nodes and tasks."""
        return ["--launcher", source or cls.kind]

    @classmethod
    def queued(cls, job_ids: Sequence[str]) -> list[str]:
        return queue.queued(job_ids)

    @classmethod
    def cancel(cls, job_ids: Sequence[str]) -> None:
        queue.cancel(job_ids)

    @classmethod
    def waiting_notes(cls, trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
        return queue.trial_job_notes(trial_jobs, worker_jobs)


def _job_name(job: Job) -> str:
    return f"abtune-{job.run_dir.absolute().name}"
