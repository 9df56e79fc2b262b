"""A study as stored: its definition in the study's user attributes, its sampler, pruner and trials.

The definition (the resolved study file) travels with the study, so `study run` on another host,
and the pruning hook inside a trial, rebuild the same sampler and pruner without the YAML file.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune.errors import ConfigError
from abtune.study.attrs import REFERENCE_ATTR, SPEC_ATTR, STUDY_DIR_ATTR
from abtune.study.options import check_options
from abtune.study.pareto_pruner import ParetoAshaPruner
from abtune.study.spec import StudySpec, parse_study_spec

PAPER_DEFAULTS = "paper-defaults"
DDP = "ddp"


SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "nsgaii": "NSGAIISampler", "nsgaiii": "NSGAIIISampler",
            "gp": "GPSampler", "qmc": "QMCSampler", "cmaes": "CmaEsSampler"}
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "hyperband": "HyperbandPruner"}  # Optuna's
PARETO_ASHA = "pareto-asha"  # abtune's, for multi-objective studies (study/pareto_pruner.py)
PARETO_ASHA_SETS = {"objectives": "set by the study's objectives", "total_steps": "set by the base's train.steps"}
SAMPLER_SETS = {"seed": "set sampler.seed instead (each worker offsets it)"}


def build_sampler(spec: StudySpec, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    name = spec.sampler.name
    factory = getattr(optuna.samplers, SAMPLERS[name])
    check_options(factory, spec.sampler.options, "sampler.options", reserved=SAMPLER_SETS)
    options = dict(spec.sampler.options)
    if name == "tpe":
        options.setdefault("constant_liar", True)  # parallel trials: do not propose what is already running
    seed = None if spec.sampler.seed is None else spec.sampler.seed + seed_offset
    try:
        return factory(seed=seed, **options)
    except (TypeError, ValueError, ImportError) as error:
        raise ConfigError(f"sampler {name} with options {spec.sampler.options}: {error}") from None


def build_pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    if spec.pruner.name == PARETO_ASHA:
        check_options(ParetoAshaPruner, spec.pruner.options, "pruner.options", reserved=PARETO_ASHA_SETS)
        return ParetoAshaPruner(spec.objectives, spec.base["train"]["steps"], **spec.pruner.options)
    factory = getattr(optuna.pruners, PRUNERS[spec.pruner.name])
    check_options(factory, spec.pruner.options, "pruner.options")
    options = dict(spec.pruner.options)
    if spec.pruner.name == "hyperband":  # "auto" would wait for a finished trial in every trial process
        options.setdefault("max_resource", spec.base["train"]["steps"])
        if isinstance(options["max_resource"], int) and options.get("min_resource", 1) > options["max_resource"]:
            raise ConfigError(f"pruner.options: min_resource {options['min_resource']} is above max_resource "
                              f"{options['max_resource']} (default: train.steps); lower min_resource")
    try:
        return factory(**options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"pruner {spec.pruner.name} with options {spec.pruner.options}: {error}") from None


class SearchStudy(optuna.Study):
    """A Study whose sampler and pruner never see the finished DDP reference trial.

    The DDP trial runs outside the search space (no parameters): shown to a sampler that
    intersects the spaces of finished trials (NSGA-II, CMA-ES, GP, multivariate TPE), it would empty
    the space. Optuna's Hyperband pruner filters trials the same way. Waiting and running DDP trials
    stay visible, so `ask()` still hands them out exactly once.
    """

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        trials = super()._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        return [t for t in trials if not (t.state.is_finished() and t.user_attrs.get(REFERENCE_ATTR) == DDP)]

    def all_trials(self) -> list[FrozenTrial]:
        """Every trial, the finished DDP reference included, through Optuna's cached storage: finished
        trials (which never change) are read once, then only new and unfinished ones."""
        return super()._get_trials(deepcopy=False)


def stored_spec(storage: BaseStorage, study_id: int) -> StudySpec:
    attrs = storage.get_study_user_attrs(study_id)
    if SPEC_ATTR not in attrs:
        name = storage.get_study_name_from_id(study_id)
        raise ConfigError(f"study {name!r} was not created by `abtune study create` (no stored definition)")
    return parse_study_spec(attrs[SPEC_ATTR], f"study {storage.get_study_name_from_id(study_id)}")


def stored_study_dir(storage: BaseStorage, study_id: int) -> Path:
    return Path(storage.get_study_user_attrs(study_id)[STUDY_DIR_ATTR])


def open_search_study(storage: BaseStorage, name: str, seed_offset: int = 0) -> tuple[SearchStudy, StudySpec]:
    study_id = storage.get_study_id_from_name(name)
    spec = stored_spec(storage, study_id)
    study = SearchStudy(name, storage, sampler=build_sampler(spec, seed_offset), pruner=build_pruner(spec))
    if study.metric_names is None:  # a study created before abtune named its objectives
        name_objectives(study, spec)
    return study, spec


def name_objectives(study: optuna.Study, spec: StudySpec) -> None:
    """Optuna's metric names: optuna-dashboard labels its axes and selectors with them ("0", "1" without)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since 3.2, still marked so
        study.set_metric_names(list(spec.objectives))


def seed_offset(trials: list[FrozenTrial]) -> int:
    """Restarted workers must not replay the sampler's first draws: offset its seed by the trials so far.

    When other workers are running (shared storage), the process id is mixed in too; one worker
    running a study from start to end stays reproducible.
    """
    running = any(t.state == TrialState.RUNNING for t in trials)
    return len(trials) * 7919 + (os.getpid() if running else 0)
