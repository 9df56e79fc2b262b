"""A study as stored: its definition in the study's user attributes, its sampler, pruner and trials.

The definition (the resolved study file) travels with the study, so `study run` on another host,
and the pruning hook inside a trial, rebuild the same sampler and pruner without the YAML file.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import DDP, REFERENCE_ATTR, SPEC_ATTR, STUDY_DIR_ATTR, WORKER_ATTR
from abtune.errors import ConfigError
from abtune.study.options import check_options
from abtune.study.pareto_pruner import ParetoAshaPruner
from abtune.study.spec import StudySpec, parse_study_spec

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


class WorkerSeededSampler(optuna.samplers.BaseSampler):
    """The study's sampler, seeded once per worker: the study's seed plus the number of the first trial the
    worker asks for.

    The storage hands out trial numbers one at a time, so workers that start at the same instant seed apart,
    which no look at the storage can promise (two workers read it before either owns a trial, and drew the
    same parameters). A lone worker on a new study draws with the study's own seed (its first trial is
    number 0); one started later does not replay the draws of those before it. A trial that some worker
    already owns (one re-attached) seeds nothing: its number was handed to another.
    """

    def __init__(self, build: Callable[[int], optuna.samplers.BaseSampler]) -> None:
        self._build = build
        self._sampler = build(0)
        self._seeded = False

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not self._seeded and WORKER_ATTR not in trial.system_attrs:
            self._sampler, self._seeded = self._build(trial.number), True
        self._sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._sampler.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


def open_search_study(storage: BaseStorage, name: str) -> tuple[SearchStudy, StudySpec]:
    study_id = storage.get_study_id_from_name(name)
    spec = stored_spec(storage, study_id)
    seeded = spec.sampler.seed is not None
    sampler = WorkerSeededSampler(functools.partial(build_sampler, spec)) if seeded else build_sampler(spec)
    study = SearchStudy(name, storage, sampler=sampler, pruner=build_pruner(spec))
    if study.metric_names is None:  # a study created before abtune named its objectives
        name_objectives(study, spec)
    return study, spec


def name_objectives(study: optuna.Study, spec: StudySpec) -> None:
    """Optuna's metric names: optuna-dashboard labels its axes and selectors with them ("0", "1" without)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since 3.2, still marked so
        study.set_metric_names(list(spec.objectives))
