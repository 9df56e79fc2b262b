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
(`ABTUNE_STORAGE`, which sbatch copies into the job), never through the sbatch script or the
pickled worker; the trial jobs inherit it from their worker the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna.trial import TrialState
from submitit.helpers import Checkpointable

from abtune.config import parse_run_config
from abtune.launch.base import Launcher, Layout, StudyWorkers, exported
from abtune.launch.profiles import check_fits

WORKERS_DIR = "workers"


def require_workers(launcher: Launcher, name: str) -> StudyWorkers:
    """Workers must outlive `study launch`: only a launcher that can submit study workers can take them."""
    from abtune.launch.launchers import study_workers

    return study_workers(launcher, name)


def job_name(study: str) -> str:
    return f"abtune-study-{study}"


class StudyWorker(Checkpointable):
    """The body of one worker job: `study run` with one trial at a time on the profile, no terminal."""

    def __init__(self, study: str, profile: dict[str, Any], max_trials: int | None, tracking: bool = True,
                 source: str | None = None) -> None:
        self.study = study
        self.profile = profile  # plain values, its kind among them: a profile holds no secret
        self.max_trials = max_trials
        self.tracking = tracking  # the store's URI (and credentials) come from the environment, like the storage
        self.source = source  # the `--launcher NAME|PATH` of `study launch`: each trial records it (`study best`)

    def __call__(self) -> dict[str, Any]:
        from abtune.launch.launchers import launcher_for, parse_profile
        from abtune.study.runner import StudyRunner
        from abtune.study.storage import open_storage, quiet_optuna, url_from_environment
        from abtune.tracking import open_tracking

        url = url_from_environment("a study worker")
        quiet_optuna()
        storage = open_storage(url)
        launcher = launcher_for(parse_profile(self.profile, "the worker's launcher profile"))
        launcher.source = self.source
        runner = StudyRunner(storage, self.study, url, 1, self.max_trials, launcher,
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


def check_study_fits(spec: Any, launcher: Launcher, name: str) -> Layout:
    from abtune.study.trials import trial_layout

    layout = trial_layout(spec, launcher)
    check_fits(parse_run_config(spec.base, f"study {name}: base"), layout)
    return layout


def dry_run(study_dir: Path, name: str, launcher: Launcher, workers: int, layout: Layout) -> str:
    """The workers' batch script and the script of one trial job, as they would be submitted."""
    from abtune.study.trials import trial_dir, trial_job_name

    script = launcher.batch_script(trial_dir(study_dir, "N"), layout, trial_job_name(name, "N")) or ""
    return (require_workers(launcher, name).workers_script(study_dir / WORKERS_DIR, workers, job_name(name))
            + f"\n# each trial: one job of {layout.nodes} node(s) x {layout.ranks_per_node} rank(s) (trial N)\n"
            + script)


def launch(study_dir: Path, name: str, url: str, launcher: Launcher, workers: int,
           max_trials: int | None, tracking: bool = True) -> list[str]:
    """Submit the workers; returns their job ids at once. The URL travels in the environment only."""
    from abtune.study.storage import storage_environment

    body = StudyWorker(name, launcher.profile.model_dump(mode="json"), max_trials, tracking, launcher.source)
    with exported(storage_environment(url)):  # sbatch copies the environment into the jobs
        return require_workers(launcher, name).submit_workers(study_dir / WORKERS_DIR, body, workers, job_name(name))
