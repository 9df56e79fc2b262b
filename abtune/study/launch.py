"""`abtune study launch`: W study workers as one SLURM job array, submitted from the login node.

Design: a worker is a light job (1 task, 1 CPU, no GPU, in the profile's partition) running the
same loop as `abtune study run` (ask -> submit the trial as its own SLURM job of `nodes x
tasks_per_node` ranks -> wait -> tell) until the study's budget, counted in the storage across
all workers, is spent. Trials are separate jobs rather than ranks of the worker's own job because
that keeps every piece as SLURM already handles it: each trial gets exactly the profile's nodes
and GPUs (no GPU idles while a worker talks to the storage), a trial is preempted, requeued or
cancelled on its own (`SLURM job N CANCELLED` fails that trial only), and its ranks start as for
`abtune train`. A worker that hits its own time limit requeues itself (submitit's checkpoint) and
re-attaches its in-flight trial's job, found by the worker's SLURM job id in the trial.

Secrets: the storage URL (maybe with a password) reaches the workers only through the environment
(`ABTUNE_STUDY_STORAGE`, which sbatch copies into the job), never through the sbatch script or the
pickled worker; the trial jobs inherit it from their worker the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from optuna.trial import TrialState
from submitit.helpers import Checkpointable

from abtune.config import parse_run_config
from abtune.errors import ConfigError
from abtune.launch.base import Launcher, Layout, exported
from abtune.launch.launchers import SlurmLauncher
from abtune.launch.profiles import SlurmProfile, check_fits
from abtune.study.pruning import STUDY_STORAGE_VARIABLE

WORKER_LAYOUT = Layout(1, 1)
WORKER_REQUEUES = 100  # a worker outlives many time limits; each one requeues it
WORKERS_DIR = "workers"
# sbatch options that ask for a node's accelerators or all of it: right for trials, not for a worker
_TRIAL_ONLY_OPTIONS = ("exclusive", "gres", "gpus", "gpus-per-task", "gpus-per-node", "mem-per-gpu", "mem-per-cpu")


def worker_profile(profile: SlurmProfile) -> SlurmProfile:
    """The profile of the worker jobs: the `worker:` section's partition, account, qos, time limit and
    CPUs, else the profile's (one CPU); the profile's setup; no GPU."""
    sbatch = {k: v for k, v in profile.sbatch.items() if k.replace("_", "-") not in _TRIAL_ONLY_OPTIONS}
    section = profile.worker
    own = {key: getattr(section, key) for key in ("partition", "account", "qos", "time_limit")
           if getattr(section, key) is not None}
    return profile.model_copy(update={"gpus_per_node": None, "cpus_per_task": section.cpus, "mem": None,
                                      "sbatch": sbatch, "max_requeues": WORKER_REQUEUES, **own})


def require_slurm(launcher: Launcher, name: str) -> SlurmLauncher:
    """Worker arrays are SLURM's: the one launcher whose jobs outlive the process that submits them."""
    if not isinstance(launcher, SlurmLauncher):
        raise ConfigError(f"--launcher {launcher.kind}: `study launch` submits SLURM jobs; use a slurm profile, "
                          f"or run the study here with `abtune study run {name}`")
    return launcher


def job_name(study: str) -> str:
    return f"abtune-study-{study}"


class StudyWorker(Checkpointable):
    """The body of one array task: `study run` with one trial at a time on the profile, no terminal."""

    def __init__(self, study: str, profile: dict[str, Any], max_trials: int | None, tracking: bool = True) -> None:
        self.study = study
        self.profile = profile  # plain values: a profile holds no secret
        self.max_trials = max_trials
        self.tracking = tracking  # the store's URI (and credentials) come from the environment, like the storage

    def __call__(self) -> dict[str, Any]:
        from abtune.study.runner import StudyRunner
        from abtune.study.storage import open_storage, quiet_optuna

        url = os.environ.get(STUDY_STORAGE_VARIABLE)
        if not url:
            raise ConfigError(f"{STUDY_STORAGE_VARIABLE} is not set: start workers with `abtune study launch`")
        quiet_optuna()
        storage = open_storage(url)
        from abtune.tracking import open_tracking

        runner = StudyRunner(storage, self.study, url, 1, self.max_trials,
                             SlurmLauncher(SlurmProfile.model_validate(self.profile)),
                             tracking=open_tracking(None, enabled=self.tracking))
        runner.run()
        trials = runner.all_trials()
        return {"started": runner.started, "finished": sum(1 for t in trials if t.state.is_finished()),
                "running": sum(1 for t in trials if t.state == TrialState.RUNNING)}


def work_left(trials: list[Any], budget: int) -> bool:
    """Something for a worker to do: a waiting trial, budget left, or a running trial to re-attach."""
    from abtune.study import results

    return (any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials)
            or results.budget_used(trials) < budget)


def check_study_fits(spec: Any, launcher: SlurmLauncher, name: str) -> Layout:
    from abtune.study.trials import trial_layout

    layout = trial_layout(spec, launcher)
    check_fits(parse_run_config(spec.base, f"study {name}: base"), layout)
    return layout


def dry_run(study_dir: Path, name: str, profile: SlurmProfile, workers: int, layout: Layout) -> str:
    """The worker array's sbatch script and the script of one trial job, as they would be submitted."""
    from abtune.launch.slurm import array_script, sbatch_script
    from abtune.study.trials import trial_job_name

    folder = study_dir / WORKERS_DIR
    trial_dir = study_dir / "trials" / "N"
    return (f"# {workers} worker(s): one job array, 1 task each\n"
            + array_script(folder, WORKER_LAYOUT, worker_profile(profile), workers, job_name(name))
            + f"\n# each trial: one job of {layout.nodes} node(s) x {layout.ranks_per_node} rank(s) (trial N)\n"
            + sbatch_script(trial_dir, layout, profile, trial_job_name(name, "N")))


def launch(study_dir: Path, name: str, url: str, profile: SlurmProfile, workers: int,
           max_trials: int | None, tracking: bool = True) -> list[str]:
    """Submit the array; returns the worker job ids at once. The URL travels in the environment only."""
    from abtune.launch.slurm import submit_array
    from abtune.study.storage import absolute_url

    body = StudyWorker(name, profile.model_dump(mode="json"), max_trials, tracking)
    with exported({STUDY_STORAGE_VARIABLE: absolute_url(url)}):  # sbatch copies the environment into the jobs
        jobs = submit_array(study_dir / WORKERS_DIR, WORKER_LAYOUT, worker_profile(profile), [body] * workers,
                            job_name(name))
    return [job.job_id for job in jobs]
