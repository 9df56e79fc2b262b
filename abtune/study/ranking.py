"""Which finished trials of a study are best, by a rule: what `abtune promote` carries to a scaling
campaign and what `abtune study confirm` re-runs.

One objective: the top K by it. Several: K of the Pareto front, ranked by `rule`. The `ddp`
reference trial and trials of methods that cannot be promoted are never chosen.
"""

from __future__ import annotations

import math
from typing import Literal

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from abtune.config import METHOD_CONFIGS
from abtune.errors import ConfigError
from abtune.study.attrs import REFERENCE_ATTR
from abtune.study.definition import DDP

Rule = Literal["best-accuracy", "least-traffic", "knee"]
RULES: tuple[Rule, ...] = ("best-accuracy", "least-traffic", "knee")


def chosen_trials(study: optuna.Study, top: int, rule: Rule = "best-accuracy") -> list[FrozenTrial]:
    """The top K finished trials of the search by `rule` (what is promoted without a confirmation)."""
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    finished = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if promotable(t)]
    if not finished:
        counts = _state_counts(study)
        raise ConfigError(f"study '{study.study_name}' has no finished trials ({counts}); "
                          "run the study first or choose another one")
    if len(study.directions) == 1:
        return top_single(finished, study.direction, top, study.study_name)
    return _top_pareto(study, finished, top, rule)


def beats(a: FrozenTrial, b: FrozenTrial, directions: list[StudyDirection]) -> bool:
    signs = [1.0 if d == StudyDirection.MAXIMIZE else -1.0 for d in directions]
    pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values, strict=True)]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def promotable(trial: FrozenTrial) -> bool:
    """Not the ddp reference, and an AB configuration (a study may also try other methods)."""
    searched = trial.params.get("method.name")  # unsearched: the study's base method, promotable or refused later
    return trial.user_attrs.get(REFERENCE_ATTR) != DDP and (searched is None or METHOD_CONFIGS[searched].promotable)


def _state_counts(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return "it has no trials at all"
    states = sorted({t.state.name for t in trials})
    return ", ".join(f"{sum(t.state.name == s for t in trials)} {s.lower()}" for s in states)


def top_single(trials: list[FrozenTrial], direction: StudyDirection, top: int, name: str) -> list[FrozenTrial]:
    if top > len(trials):
        raise ConfigError(f"--top {top}: study '{name}' has only {len(trials)} finished trial(s) "
                          "(ddp trials excluded); ask for fewer")
    reverse = direction == StudyDirection.MAXIMIZE
    return sorted(trials, key=lambda t: (t.value, -t.number if reverse else t.number), reverse=reverse)[:top]


def _top_pareto(study: optuna.Study, finished: list[FrozenTrial], top: int, rule: Rule) -> list[FrozenTrial]:
    numbers = {t.number for t in finished}
    front = [t for t in study.best_trials if t.number in numbers]
    if top > len(front):
        raise ConfigError(f"--top {top}: the Pareto front of study '{study.study_name}' holds only "
                          f"{len(front)} trial(s); ask for fewer")
    return rank_front(front, list(study.directions), rule)[:top]


def rank_front(front: list[FrozenTrial], directions: list[StudyDirection], rule: Rule) -> list[FrozenTrial]:
    """best-accuracy: by the first maximized objective; least-traffic: by the first minimized one;
    knee: by distance to the ideal point once every objective is scaled to [0, 1] over the front."""
    if rule == "knee":
        return sorted(front, key=lambda t: (_distance_to_ideal(t, front, directions), t.number))
    wanted = StudyDirection.MAXIMIZE if rule == "best-accuracy" else StudyDirection.MINIMIZE
    if wanted not in directions:
        raise ConfigError(f"--rule {rule}: the study has no {wanted.name.lower()}d objective; "
                          f"choose one of {', '.join(RULES)}")
    index = directions.index(wanted)
    sign = -1.0 if wanted == StudyDirection.MAXIMIZE else 1.0
    return sorted(front, key=lambda t: (sign * t.values[index], t.number))


def _distance_to_ideal(trial: FrozenTrial, front: list[FrozenTrial], directions: list[StudyDirection]) -> float:
    total = 0.0
    for i, direction in enumerate(directions):
        values = [t.values[i] for t in front]
        low, high = min(values), max(values)
        scaled = 0.0 if high == low else (trial.values[i] - low) / (high - low)
        shortfall = 1.0 - scaled if direction == StudyDirection.MAXIMIZE else scaled
        total += shortfall**2
    return math.sqrt(total)
