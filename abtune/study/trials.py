"""One trial's run: its layout, its configuration (suggested or a reference), its hooks, its job.

The study runner (runner.py), seed repeats (repeats.py) and `study confirm` (confirm.py) all start
their runs with these, through the run lifecycle (abtune/runs.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from abtune.attrs import DDP, LAUNCHER_ATTR, REFERENCE_ATTR, RETRY_OF_ATTR
from abtune.config import RunConfig, apply_overrides, parse_run_config
from abtune.errors import ConfigError
from abtune.launch.base import Job, Launcher, Layout
from abtune.launch.launchers import study_launcher_kinds
from abtune.launch.profiles import check_fits
from abtune.runfiles import CHECKPOINTS_DIR, METRICS_FILE, complete_checkpoints, latest_checkpoint_step
from abtune.runs import Run
from abtune.study.optuna_private import trial_id
from abtune.study.pruning import make_hook
from abtune.study.space import ddp_reference_config
from abtune.study.spec import StudySpec
from abtune.training.hooks import hook_spec
from abtune.words import either

TRIALS_DIR = "trials"  # STUDY_DIR/trials/N: one run folder per trial


def trial_hook_specs(spec: StudySpec, study_name: str, trial: optuna.Trial) -> list[dict[str, Any]]:
    """Every hook a trial's rank 0 runs (hooks.yaml). Tracking adds its hook here.

    Search trials report their objectives at each evaluation (study/pruning.py); the paper-defaults
    trial reports but is never pruned; the DDP reference, outside the search space, does neither.
    Options are plain values: the storage URL reaches the hook through ABTUNE_STORAGE, never
    through hooks.yaml.
    """
    reference = trial.user_attrs.get(REFERENCE_ATTR)
    specs: list[dict[str, Any]] = []
    if reference != DDP:
        prune = spec.pruner.name != "none" and reference is None
        specs.append(hook_spec(make_hook, study=study_name, trial_id=trial_id(trial), prune=prune))
    return specs


def trial_layout(spec: StudySpec, launcher: Launcher) -> Layout:
    """Ranks of every trial, as the launcher lays them out (locally the study's `layout`; a cluster's profile
    may set nodes and tasks)."""
    if not launcher.runs_studies:
        raise ConfigError(f"--launcher {launcher.kind}: studies run on {either(list(study_launcher_kinds()))} profiles "
                          f"(step through one run with `abtune train --launcher {launcher.kind}`)")
    measures_nodes = "inter_node_bytes" in spec.objectives or spec.constraints.max_inter_node_mb is not None
    return launcher.trial_layout(spec.layout.nproc, spec.layout.per_node, measures_nodes)


def record_launcher(trial: optuna.Trial, launcher: Launcher) -> None:
    """The `--launcher NAME|PATH` the trial runs with (its kind when loaded otherwise): `study best` names it
    in the command that runs the trial again."""
    trial.set_user_attr(LAUNCHER_ATTR, launcher.source or launcher.kind)


def trial_dir(study_dir: Path, number: int | str) -> Path:
    """The run folder of trial `number` (a repeated trial's seeds are folders inside it)."""
    return study_dir / TRIALS_DIR / str(number)


def trial_job_name(study: str, number: int | str) -> str:
    return f"abtune-{study}-{number}"


def submit_trial(run: Run, spec: StudySpec, job_name: str, env: dict[str, str] | None = None) -> Job:
    """The one place a trial's run (or one seed of it) is handed to its launcher."""
    return run.submit(job_name=job_name, timeout_min=spec.trial_timeout_min, env=env)


def suggest(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> Any:
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    assert isinstance(distribution, FloatDistribution)
    return trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)


def trial_config(spec: StudySpec, study_name: str, distributions: dict[str, BaseDistribution],
                 trial: optuna.Trial, layout: Layout) -> RunConfig:
    """The run config of a trial: DDP's for the DDP reference, else the base with the suggested values."""
    if trial.user_attrs.get(REFERENCE_ATTR) == DDP:
        raw = ddp_reference_config(spec)
    else:
        params = {name: suggest(trial, name, dist) for name, dist in distributions.items()}
        raw = apply_overrides(spec.base, params)
    raw["name"] = f"{study_name}-{trial.number}"
    config = parse_run_config(raw, f"trial {trial.number}")
    check_fits(config, layout)
    return config


def adopt_retried_checkpoint(study_dir: Path, trial: optuna.Trial, run_dir: Path) -> bool:
    """A retry continues from the newest complete checkpoint of the trial it replaces, if any."""
    previous = trial.user_attrs.get(RETRY_OF_ATTR)
    if previous is None:
        return False
    step = adopt_checkpoint(trial_dir(study_dir, previous), run_dir)
    if step is None:
        return False
    trial.set_user_attr("resumed_from_step", step)
    return True


def adopt_checkpoint(source: Path, run_dir: Path) -> int | None:
    """Copy the newest complete checkpoint (and the metrics so far) of `source` into `run_dir`; its step."""
    complete = complete_checkpoints(source)
    if not complete:
        return None
    shutil.copytree(complete[-1], run_dir / CHECKPOINTS_DIR / complete[-1].name)
    if (source / METRICS_FILE).exists():
        shutil.copy(source / METRICS_FILE, run_dir / METRICS_FILE)
    return latest_checkpoint_step(source)
