"""`pruner: pareto-asha`: early stopping for multi-objective studies.

Optuna's pruners rank one intermediate value per trial, so they refuse multi-objective studies.
This one is asynchronous successive halving (ASHA, Li et al. arXiv 1810.05934) whose ranking is
the Pareto order of NSGA-II instead of a single value:

- Rungs lie at `first_rung x reduction_factor^k` of train.steps (k = 0, 1, ... while below the
  last step): with the defaults 1/9 and 3, at 1/9 and 1/3 of the run.
- A trial is judged at each rung once, at its first evaluation at or after the rung's step, on
  what every objective says there (`Objective.at_evaluation`: the top-1 so far, the inter-node
  bytes its run will have sent by its last step as predicted from its schedule, ...).
- It is set against every trial that has reached the rung so far (running, finished or pruned,
  each with its values at its own first evaluation past the rung), and ordered by non-dominated
  front, then by crowding distance inside the front (the lonelier point first: it widens the
  front), then by trial number. It continues if it is among the first max(1, n // reduction_factor)
  of the n trials; with fewer than `min_trials` at the rung everyone continues. Like ASHA, no trial
  waits for a rung to fill: the early arrivals at a rung are judged against fewer trials.

So a trial dominated at its rung stops before any trial of the first front does; among trials of
the first front the most crowded stop first. Reference trials are never pruned (the hook does not
ask); a repeated trial is judged on the mean over its seeds so far (the hook stores the mean).
The values live in the trial's user attribute `evaluations` ({step: {objective: value}}), the
numbers the plots and `study export` read too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial

from abtune.attrs import EVALUATIONS_ATTR, REFERENCE_ATTR
from abtune.errors import ConfigError
from abtune.objectives import OBJECTIVES, non_dominated_fronts

Values = list[float]  # one rung entry: every objective's score (Objective.score, higher is better)


class ParetoAshaPruner(BasePruner):
    def __init__(self, objectives: Sequence[str], total_steps: int, first_rung: float = 1 / 9,
                 reduction_factor: int = 3, min_trials: int = 3) -> None:
        if not 0 < first_rung < 1:
            raise ConfigError(f"pruner.options.first_rung: the first rung as a fraction of train.steps, in (0, 1); "
                              f"got {first_rung}")
        if reduction_factor < 2:
            raise ConfigError(f"pruner.options.reduction_factor: must be >= 2, got {reduction_factor}")
        if min_trials < 1:
            raise ConfigError(f"pruner.options.min_trials: must be >= 1, got {min_trials}")
        unknown = [m for m in objectives if OBJECTIVES[m].at_evaluation is None]
        if unknown:
            raise ConfigError(f"pruner: pareto-asha ranks trials while they run, and {', '.join(unknown)} is known "
                              "only when a run ends: drop it from objectives or set pruner: none")
        self.objectives = [OBJECTIVES[m] for m in objectives]
        self.reduction_factor, self.min_trials = reduction_factor, min_trials
        self.rungs = rung_steps(total_steps, first_rung, reduction_factor)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if trial.user_attrs.get(REFERENCE_ATTR) is not None:
            return False
        mine = evaluations(trial)
        if not mine:
            return False
        rung = judged_rung(self.rungs, sorted(mine))
        if rung is None:
            return False
        own = self._at_rung(mine, rung)
        if own is None:  # an objective it cannot predict yet: nothing to judge on
            return False
        entries = {}
        for other in study.get_trials(deepcopy=False):
            values = self._at_rung(evaluations(other), rung)
            if values is not None:
                entries[other.number] = values
        entries[trial.number] = own
        return not continues(trial.number, entries, self.reduction_factor, self.min_trials)

    def _at_rung(self, by_step: Mapping[int, Mapping[str, float | None]], rung: int) -> Values | None:
        """The scores of the first evaluation at or after `rung`; None if none or incomplete."""
        step = next((s for s in sorted(by_step) if s >= rung), None)
        if step is None:
            return None
        values = [by_step[step].get(o.name) for o in self.objectives]
        if any(v is None or math.isnan(v) for v in values):
            return None
        return [o.score(float(v)) for o, v in zip(self.objectives, values, strict=True)]  # type: ignore[arg-type]


def rung_steps(total_steps: int, first_rung: float, reduction_factor: int) -> list[int]:
    rungs, fraction = [], first_rung
    while fraction < 1:
        step = max(1, math.ceil(fraction * total_steps))
        if step >= total_steps:
            break
        if not rungs or step > rungs[-1]:
            rungs.append(step)
        fraction *= reduction_factor
    return rungs


def judged_rung(rungs: Sequence[int], steps: Sequence[int]) -> int | None:
    """The rung the latest of `steps` (sorted evaluation steps) is the first evaluation at or after; None if none."""
    latest = steps[-1]
    before = steps[-2] if len(steps) > 1 else 0
    passed = [r for r in rungs if before < r <= latest]
    return passed[-1] if passed else None


def evaluations(trial: FrozenTrial) -> dict[int, dict[str, float | None]]:
    return {int(step): values for step, values in trial.user_attrs.get(EVALUATIONS_ATTR, {}).items()}


def continues(number: int, entries: Mapping[int, Values], reduction_factor: int, min_trials: int) -> bool:
    if len(entries) < min_trials:
        return True
    keep = max(1, len(entries) // reduction_factor)
    return pareto_order(entries).index(number) < keep


def pareto_order(entries: Mapping[int, Values]) -> list[int]:
    """Trial numbers best first: non-dominated front, then crowding distance (largest first), then number."""
    ordered: list[int] = []
    for front in non_dominated_fronts(entries):
        distance = crowding_distances({n: entries[n] for n in front})
        ordered += sorted(front, key=lambda n: (-distance[n], n))
    return ordered


def crowding_distances(front: Mapping[int, Values]) -> dict[int, float]:
    """NSGA-II's crowding distance: per objective, the normalized gap between a point's neighbours; the
    extremes of each objective get infinity. Points are ordered best score first, ties by number."""
    distance = dict.fromkeys(front, 0.0)
    if len(front) <= 2:
        return dict.fromkeys(front, math.inf)
    for k in range(len(next(iter(front.values())))):
        ordered = sorted(front, key=lambda n: (-front[n][k], n))
        best, worst = front[ordered[0]][k], front[ordered[-1]][k]
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        if best == worst:
            continue
        for before, point, after in zip(ordered, ordered[1:], ordered[2:], strict=False):
            distance[point] += (front[before][k] - front[after][k]) / (best - worst)
    return distance
