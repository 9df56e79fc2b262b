"""Seed repeats: with `repeats: K` a trial is K runs of one configuration, one per seed.

Seeds: repeat i of a configuration whose run config has seed B uses seed B + 1000 i, so repeat 0 is
the configuration as searched and `repeats: 1` is the study as before (one run in `trials/N/`).
With K > 1 the seeds are recorded in the trial's user attr `seeds`, each runs in its own folder
`trials/N/seed_S/`, and `trials/N/config.yaml` is the configuration with seed B (to run it again).
On SLURM every seed is its own job (not a job array).

Order: without a pruner the seeds of a trial run side by side (locally: K x nproc processes). With
a pruner they run one after another, so the pruner sees the running mean: seed i's pruning hook
reports the mean of seeds 0..i at each step (over the value seed i-1 left). When a trial's seeds
are done its intermediate values are the mean curve; its objective values are the means; mean,
sample std and each seed's value are user attrs (`top1`, `top1_std`, `top1_seeds`, ...) and
metrics of its MLflow run, whose child runs are the seeds.

A retry (Ctrl-C, a failed run) takes over what the trial it replaces finished: a seed folder holding
summary.json is copied, not run again (`reused_seeds`); a seed with a complete checkpoint resumes
from it.

Every seed's job is recorded on the trial as it starts (`seed_jobs`: kind, launcher record, MLflow
child run). A runner that finds a trial its dead predecessor left RUNNING re-attaches it seed by seed
(`resume_trial`): a finished seed is kept, a seed whose job still runs (or ended with a result) is
followed, and only a seed whose job is gone is started again, from its own newest checkpoint.
`abtune study stop` cancels every live seed job of such a trial (`SeedJobs`).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from abtune.attrs import (
    EVALUATIONS_ATTR,
    RETRY_OF_ATTR,
    REUSED_SEEDS_ATTR,
    RUN_DIR_ATTR,
    SEED_JOBS_ATTR,
    SEEDS_ATTR,
)
from abtune.config import RunConfig, load_run_config
from abtune.launch.base import Job, Launcher, Layout
from abtune.launch.launchers import followed, job_entry
from abtune.launch.outcome import RunOutcome
from abtune.rundir import prepare_run_dir
from abtune.runfiles import CONFIG_FILE, SUMMARY_FILE, complete_checkpoints, read_summary, summary_path
from abtune.runs import FAILED, FINISHED, KILLED, Run
from abtune.study import results, stats
from abtune.study.optuna_private import trial_id
from abtune.study.pool import JobPool
from abtune.study.pruning import mean_evaluations
from abtune.study.trials import adopt_checkpoint, record_launcher, trial_dir, trial_hook_specs

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

    from abtune.study.spec import StudySpec
    from abtune.tracking import Tracking

SEED_STRIDE = 1000
SPREAD_KEYS = ("top1", "best_top1", "inter_node_bytes", "compression", "train_seconds", "time_to_target")


def repeat_seed(base: int, index: int) -> int:
    return base + SEED_STRIDE * index


def seed_dir(trial_dir: Path, seed: int) -> Path:
    return trial_dir / f"seed_{seed}"


# --- the result of a trial ------------------------------------------------------------------------
def trial_attrs(run_dir: Path, seeds: Sequence[int] | None, wall_seconds: float) -> dict[str, Any] | str:
    """The trial's result attrs (means over the seeds that ran), or why there is none."""
    if not seeds:
        summary_file = summary_path(run_dir)
        if not summary_file.exists():
            return f"the run ended without writing {summary_file}"
        return results.result_attrs(read_summary(run_dir), wall_seconds)
    each = {s: results.result_attrs(read_summary(seed_dir(run_dir, s)), wall_seconds)
            for s in seeds if summary_path(seed_dir(run_dir, s)).exists()}
    if not each:
        return f"no seed of the trial wrote {SUMMARY_FILE} (first: {seed_dir(run_dir, seeds[0])})"
    return aggregate(each, wall_seconds)


def aggregate(each: dict[int, dict[str, Any]], wall_seconds: float) -> dict[str, Any]:
    """Means of every numeric result; spread and per-seed values of SPREAD_KEYS; the earliest stop."""
    rows = list(each.values())
    attrs: dict[str, Any] = {}
    for key, first in rows[0].items():
        values = [row[key] for row in rows]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        attrs[key] = stats.mean(values) if numeric else first
    for key in SPREAD_KEYS:
        values = [row[key] for row in rows]
        if all(isinstance(v, int | float) for v in values):
            attrs[f"{key}_std"] = stats.std(values)
            attrs[f"{key}_seeds"] = values
    attrs["steps_done"] = min(row["steps_done"] for row in rows)
    attrs["stopped_early"] = next((row["stopped_early"] for row in rows if row["stopped_early"]), None)
    attrs["wall_seconds"] = wall_seconds
    attrs["seeds_done"] = list(each)
    return attrs


def spread_metrics(attrs: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics of a repeated trial: KEY_mean, KEY_std and KEY_seed_S (finite values only)."""
    metrics: dict[str, float] = {}
    for key in SPREAD_KEYS:
        if f"{key}_seeds" not in attrs:
            continue
        metrics[f"{key}_mean"], metrics[f"{key}_std"] = attrs[key], attrs[f"{key}_std"]
        metrics.update({f"{key}_seed_{s}": v for s, v in zip(attrs["seeds_done"], attrs[f"{key}_seeds"], strict=True)})
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}


class TrialRunner(Protocol):
    """What running a repeated trial needs of the study runner (runner.py's StudyRunner): no more."""

    spec: StudySpec
    study: optuna.Study
    study_dir: Path
    storage: BaseStorage
    launcher: Launcher
    layout: Layout
    tracking: Tracking
    trial_env: dict[str, str]

    def prepare_run(self, config: RunConfig, run_dir: Path, hooks: list[dict[str, Any]], run_id: str | None,
                    continues_checkpoint: bool = False) -> Run: ...


# --- running the seeds of one trial ---------------------------------------------------------------
@dataclass
class SeedRun:
    seed: int
    run_dir: Path
    resume: bool = False
    finished: bool = False  # summary.json is there (run here, or taken over from the trial it retries)
    run: Run | None = None  # once started
    outcome: RunOutcome | None = None

    @property
    def job(self) -> Job | None:
        return None if self.run is None else self.run.job

    @property
    def pruned(self) -> bool:
        summary = summary_path(self.run_dir)
        return self.finished and bool(json.loads(summary.read_text()).get("stopped_early"))


class RepeatedJob(Job):
    """The seeds of one trial, seen by the runner as one job: `poll()` polls the seed jobs and starts the
    next ones (at most `concurrent` at a time), and says how they ended once all have."""

    kind = "repeats"  # not recorded in the trial: a runner that dies leaves its seeds to a retry

    def __init__(self, trial_dir: Path, runs: list[SeedRun], concurrent: int, start: Callable[[SeedRun], Run],
                 end: Callable[[SeedRun, bool], None], complete: Callable[[], None]) -> None:
        super().__init__(trial_dir.name, trial_dir)
        self.runs = runs
        self._start, self._end, self._complete = start, end, complete
        self.pool = JobPool(concurrent, self._start_seed, [r for r in runs if r.job is None and not r.finished])
        for run in runs:
            if run.job is not None:  # re-attached: its job was started by the runner that died
                self.pool.adopt(run, run.job)
        self.cancelled = False
        self._completed = False

    def _start_seed(self, run: SeedRun) -> Job:
        run.run = self._start(run)
        assert run.job is not None
        return run.job

    def poll(self) -> RunOutcome | None:
        for run, ended in self.pool.poll():
            self._ended(run, ended)
        self.pool.fill(may_start=lambda: not self._stopped(),  # a refused submission fails this trial only
                       refused=lambda run, error: self._ended(run, RunOutcome(False, f"seed {run.seed} not started: "
                                                                                     f"{error}", 1)))
        if self.pool.running:
            return None
        result = self._result()
        if not self._completed and result.ok:
            self._completed = True
            self._complete()
        return result

    def _ended(self, run: SeedRun, ended: RunOutcome) -> None:
        run.outcome = ended
        run.finished = ended.ok and summary_path(run.run_dir).exists()
        self._end(run, self.cancelled)

    def _stopped(self) -> bool:
        return self.cancelled or any(r.outcome is not None and not r.outcome.ok for r in self.runs) \
            or any(r.pruned for r in self.runs)

    def _result(self) -> RunOutcome:
        failed = [r for r in self.runs if r.outcome is not None and not r.outcome.ok]
        if failed:
            first = failed[0].outcome
            assert first is not None
            return RunOutcome(False, f"seed {failed[0].seed}: {first.reason}", first.exit_code)
        if self.cancelled and not all(r.finished for r in self.runs):
            return RunOutcome(False, "cancelled", 1)
        return RunOutcome(True)

    def cancel(self) -> None:
        self.cancelled = True
        self.pool.cancel()


def start_trial(runner: TrialRunner, trial: Any, config: RunConfig, run_id: str | None) -> Run:
    """Prepare `trials/N/` and its seeds, take over what a retried trial finished, start the first seeds:
    the trial's run, whose job is its seeds'."""
    folder = trial_dir(runner.study_dir, trial.number)
    prepare_run_dir(config, folder, resume=False)
    seeds = [repeat_seed(config.seed, i) for i in range(runner.spec.repeats)]
    trial.set_user_attr(SEEDS_ATTR, seeds)
    trial.set_user_attr(RUN_DIR_ATTR, str(folder))
    record_launcher(trial, runner.launcher)
    runs = [SeedRun(s, seed_dir(folder, s)) for s in seeds]
    previous = trial.user_attrs.get(RETRY_OF_ATTR)
    if previous is not None:
        _take_over(trial_dir(runner.study_dir, previous), runs, trial)
    return _repeated_run(runner, trial, config, run_id, folder, runs, {})


def is_repeated(trial: Any) -> bool:
    """A trial of seed repeats whose folder exists (its runner got as far as preparing it)."""
    return len(trial.user_attrs.get(SEEDS_ATTR) or []) > 1 and bool(trial.user_attrs.get(RUN_DIR_ATTR))


def resume_trial(runner: TrialRunner, trial: Any, run_id: str | None) -> tuple[Run, list[str]]:
    """A repeated trial whose runner died, re-attached seed by seed (see the module's docstring); with
    what became of each seed, in words."""
    trial_dir = Path(trial.user_attrs[RUN_DIR_ATTR])
    config = load_run_config(trial_dir / CONFIG_FILE)  # the configuration with repeat 0's seed
    recorded: dict[str, dict[str, Any]] = dict(trial.user_attrs.get(SEED_JOBS_ATTR, {}))
    runs, notes = [], []
    for seed in trial.user_attrs[SEEDS_ATTR]:
        run = SeedRun(seed, seed_dir(trial_dir, seed))
        run.finished = summary_path(run.run_dir).exists()
        entry = recorded.get(str(seed))
        job = followed(entry, run.run_dir) if entry and not run.finished else None
        if job is not None:
            run.run = Run(run.run_dir, runner.launcher, runner.layout, job=job)
            run.run.track(runner.tracking, entry.get("run_id"))  # type: ignore[union-attr]
            notes.append(f"seed {seed}: following {job.describe()}")
        elif run.finished:
            if entry:  # it ended while no runner watched: close its MLflow run
                runner.tracking.finish_run(entry.get("run_id"), run.run_dir, FINISHED)
            notes.append(f"seed {seed}: finished")
        else:
            if entry:  # its job is gone: that launch's MLflow run ends here, the new launch gets its own
                runner.tracking.finish_run(entry.get("run_id"), None, KILLED)
            run.resume = bool(complete_checkpoints(run.run_dir))
            notes.append(f"seed {seed}: " + ("to resume from its checkpoint" if run.resume else "to run from the start"))
        runs.append(run)
    return _repeated_run(runner, trial, config, run_id, trial_dir, runs, recorded), notes


def _repeated_run(runner: TrialRunner, trial: Any, config: RunConfig, run_id: str | None, trial_dir: Path,
                  runs: list[SeedRun], recorded: dict[str, dict[str, Any]]) -> Run:
    seeds = [r.seed for r in runs]
    hooks = trial_hook_specs(runner.spec, runner.study.study_name, trial)
    sequential = any(h["options"].get("prune") for h in hooks)  # the pruner needs the running mean
    seeds_of = _SeedStarter(runner, trial, config, run_id, hooks if sequential else [], runs, recorded)

    def complete() -> None:
        if hooks:  # the trial reports its evaluations: make them the means over the seeds
            evaluations = mean_evaluations([r.run_dir for r in runs if r.finished], runner.spec.objectives)
            trial.set_user_attr(EVALUATIONS_ATTR, evaluations)
            if not runner.spec.multi_objective:  # Optuna's intermediate values hold one objective
                for step, values in evaluations.items():
                    runner.storage.set_trial_intermediate_value(trial_id(trial), int(step), values["top1"])
        attrs = trial_attrs(trial_dir, seeds, 0.0)
        if isinstance(attrs, dict):
            runner.tracking.log_metrics(run_id, spread_metrics(attrs))

    trial_run = Run(trial_dir, runner.launcher, runner.layout)
    trial_run.track(runner.tracking, run_id)
    trial_run.job = RepeatedJob(trial_dir, runs, 1 if sequential else len(runs), seeds_of.start, seeds_of.end,
                                complete)
    trial_run.job.poll()
    return trial_run


def _take_over(previous_dir: Path, runs: list[SeedRun], trial: Any) -> None:
    reused = []
    for run in runs:
        source = seed_dir(previous_dir, run.seed)
        if summary_path(source).exists():
            shutil.copytree(source, run.run_dir)
            run.finished = True
            reused.append(run.seed)
        elif source.is_dir():
            run.resume = adopt_checkpoint(source, run.run_dir) is not None
    if reused:
        trial.set_user_attr(REUSED_SEEDS_ATTR, reused)


@dataclass
class _SeedStarter:
    """Starts one seed of a trial (its folder, hooks, MLflow child run, job) and records its end."""

    runner: TrialRunner
    trial: Any
    config: RunConfig
    run_id: str | None
    hooks: list[dict[str, Any]]
    runs: list[SeedRun]
    recorded: dict[str, dict[str, Any]]  # the trial's SEED_JOBS_ATTR

    def start(self, seed_run: SeedRun) -> Run:
        from abtune.study.trials import submit_trial, trial_job_name
        from abtune.tracking import LaunchInfo

        runner, number = self.runner, self.trial.number
        config = self.config.model_copy(update={"seed": seed_run.seed})
        earlier = [str(r.run_dir) for r in self.runs[:self.runs.index(seed_run)]]
        hooks = [{**h, "options": {**h["options"], "earlier": earlier}} for h in self.hooks]
        child_run_id = None
        if self.run_id is not None:
            child_run_id = runner.tracking.start_run(
                config, experiment=runner.study.study_name, run_name=f"trial-{number}-seed-{seed_run.seed}",
                parent_run_id=self.run_id, tags={"optuna.study": runner.study.study_name,
                                                 "optuna.trial_number": number, "abtune.seed": seed_run.seed},
                launch_info=LaunchInfo(runner.launcher.kind, runner.layout.world_size, runner.layout.ranks_per_node),
                required=False)
        run = runner.prepare_run(config, seed_run.run_dir, hooks, child_run_id, continues_checkpoint=seed_run.resume)
        submit_trial(run, runner.spec, trial_job_name(runner.study.study_name, f"{number}-seed{seed_run.seed}"),
                     runner.trial_env)
        assert run.job is not None
        entry = job_entry(run.job, child_run_id)
        if entry is not None:  # followed seed by seed by the next runner if this one dies
            self.recorded[str(seed_run.seed)] = entry
            self.trial.set_user_attr(SEED_JOBS_ATTR, self.recorded)
        return run

    def end(self, seed_run: SeedRun, cancelled: bool) -> None:
        assert seed_run.outcome is not None and seed_run.run is not None
        seed_run.run.finish(FINISHED if seed_run.outcome.ok else (KILLED if cancelled else FAILED))
