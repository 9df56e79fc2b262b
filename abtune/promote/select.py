"""Which trials of a study are promoted, and what they carry.

A promoted configuration carries only the settings that transfer between scales: AB's fractions,
sigma cutoff and sync mode (never absolute step counts, batch sizes or the model). Trial params are
named by dotted run-config keys (`method.warmup_frac`). The `ddp` reference trial (user attr
`reference: ddp`) and other non-AB trials are never promoted: the DDP baseline is planned for every
node count anyway. The `paper-defaults` reference competes like any other trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from abtune.errors import ConfigError

Rule = Literal["best-accuracy", "least-traffic", "knee"]
RULES: tuple[Rule, ...] = ("best-accuracy", "least-traffic", "knee")
PROMOTED_KEYS = ("method.name", "method.warmup_frac", "method.ab_frac", "method.rebound_frac",
                 "method.lr_rebound_frac", "method.sigma_cutoff", "method.sync_mode")
REFERENCE_ATTR = "reference"
MLFLOW_RUN_ATTR = "mlflow_run_id"
AB_METHODS = ("ab", "ab-nogroups")


@dataclass(frozen=True)
class Source:
    study: str
    trial: int
    values: tuple[float, ...]
    mlflow_run_id: str | None = None

    def describe(self) -> str:
        run = f", mlflow {self.mlflow_run_id}" if self.mlflow_run_id else ""
        return f"{self.study} #{self.trial}{run}"


@dataclass(frozen=True)
class Promoted:
    """One configuration to scale: its name, the dotted overrides it carries, and where it came from."""

    name: str
    overrides: dict[str, Any]
    source: Source | None = None
    dropped: tuple[str, ...] = field(default=())  # trial params that do not transfer to the target


def promoted_from_study(study: optuna.Study, top: int, rule: Rule = "best-accuracy") -> list[Promoted]:
    """The adapter from a study: top K finished trials (one objective) or K of the Pareto front (several)."""
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    finished = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if _promotable(t)]
    if not finished:
        counts = _state_counts(study)
        raise ConfigError(f"study '{study.study_name}' has no finished trials ({counts}); "
                          "run the study first or choose another one")
    if len(study.directions) == 1:
        chosen = _top_single(finished, study.direction, top, study.study_name)
    else:
        chosen = _top_pareto(study, finished, top, rule)
    return [promote_trial(study.study_name, t) for t in chosen]


def _promotable(trial: FrozenTrial) -> bool:
    """Not the ddp reference, and an AB configuration (a study may also try other methods)."""
    return trial.user_attrs.get(REFERENCE_ATTR) != "ddp" and trial.params.get("method.name", "ab") in AB_METHODS


def promote_trial(study_name: str, trial: FrozenTrial) -> Promoted:
    carried = {k: v for k, v in trial.params.items() if k in PROMOTED_KEYS}
    dropped = tuple(sorted(k for k in trial.params if k not in PROMOTED_KEYS))
    source = Source(study_name, trial.number, tuple(trial.values or ()), trial.user_attrs.get(MLFLOW_RUN_ATTR))
    return Promoted(f"trial-{trial.number}", carried, source, dropped)


def _state_counts(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return "it has no trials at all"
    states = sorted({t.state.name for t in trials})
    return ", ".join(f"{sum(t.state.name == s for t in trials)} {s.lower()}" for s in states)


def _top_single(trials: list[FrozenTrial], direction: StudyDirection, top: int, name: str) -> list[FrozenTrial]:
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


def load_study(name: str, url: str) -> optuna.Study:
    """A study from the storage `abtune study` uses; one clear line when it is not there."""
    from abtune.study.storage import open_storage, require_study

    storage = open_storage(url)
    require_study(storage, name, url)
    return optuna.load_study(study_name=name, storage=storage)
