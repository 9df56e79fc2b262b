"""Warm start across scales: a new study (more nodes, another cluster) seeded from a finished one.

`abtune study create NEW.yaml --warm-start OLD` enqueues, before anything else, the old study's confirmed
picks (when `abtune study confirm` ran) and then its Pareto front in the order of its recommendation
(study/recommendation.py): the new study's first trials are the configurations the old one found best.
Only the parameters both spaces search are carried, and only values inside the new space's bounds; a
parameter the new study searches that the old did not is left to the sampler. Each enqueued trial is
marked `warm_start_of: OLD #N`. The old study's other trials are not copied: their results were measured
at another scale (traffic especially) and would mislead the new study's sampler and its Pareto front.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution

from abtune.attrs import ATTEMPT_ATTR, WARM_START_ATTR
from abtune.errors import ConfigError
from abtune.study import recommendation
from abtune.study.optuna_private import contains


def seeds_of(old: optuna.Study, distributions: dict[str, BaseDistribution],
             planned: list[dict[str, Any]] | None = None) -> list[tuple[dict[str, Any], int]]:
    """(parameters, old trial number) to enqueue: confirmed picks, then the front, as the new space takes them;
    none that repeats `planned` (the new study's own paper-defaults trial) or another."""
    confirmed = recommendation.current(old)
    searched = recommendation.decide(old, search_only=True)
    if searched is None:
        raise ConfigError(f"--warm-start {old.study_name}: that study has no finished trial to start from; "
                          "run it first or start cold")
    order = [*(confirmed.ranked if confirmed is not None and confirmed.confirmed else []), *searched.ranked]
    by_number = {t.number: t for t in old.get_trials(deepcopy=False)}
    seeds: list[tuple[dict[str, Any], int]] = []
    for number in dict.fromkeys(order):
        params = _carried(by_number[number].params, distributions)
        if params and params not in (planned or []) and all(params != seen for seen, _ in seeds):
            seeds.append((params, number))
    return seeds


def _carried(params: dict[str, Any], distributions: dict[str, BaseDistribution]) -> dict[str, Any]:
    kept = {}
    for name, value in params.items():
        distribution = distributions.get(name)
        if distribution is not None and contains(distribution, value):
            kept[name] = value
    return kept


def enqueue(study: optuna.Study, old: optuna.Study, distributions: dict[str, BaseDistribution],
            planned: list[dict[str, Any]] | None = None) -> list[int]:
    """Enqueue the old study's picks and front in `study` (none repeating `planned`); the old trial numbers."""
    seeds = seeds_of(old, distributions, planned)
    for params, number in seeds:
        study.enqueue_trial(params, user_attrs={WARM_START_ATTR: f"{old.study_name} #{number}", ATTEMPT_ATTR: 0})
    return [number for _, number in seeds]
