"""Which finished trials of a study are best, by a rule: what `abtune study best` recommends, what
`abtune promote` carries to a scaling campaign and what `abtune study confirm` re-runs (one rule, the
same default, set with `--rule` and `--margin` on each).

One objective: the top K by it. Several: K of the Pareto front, ranked by the rule:
- `within-margin` (the default): the front's trials within `margin` top-1 of DDP's top-1 measured in the
  same study (study/recommendation.py passes it; without a DDP reference, of the front's best top-1),
  best on the study's other objective first (least inter-node bytes), then the rest of the front by
  top-1. A point of top-1 is within the seed-to-seed spread of a small study, so the default margin
  (0.01) trades noise for traffic;
- `best-accuracy`: by the first maximized objective (top-1);
- `least-traffic`: by the first minimized objective;
- `knee`: by distance to the ideal point once every objective is scaled to [0, 1] over the front.
The `ddp` reference trial and trials of methods that cannot be promoted are never chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from abtune.attrs import DDP, REFERENCE_ATTR
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS
from abtune.objectives import OBJECTIVES, pareto_mask, signed

RuleName = Literal["within-margin", "best-accuracy", "least-traffic", "knee"]
RULES: tuple[RuleName, ...] = get_args(RuleName)
DEFAULT_MARGIN = 0.01  # top-1


@dataclass(frozen=True)
class Rule:
    """How to rank a Pareto front; `margin` (top-1) is read by `within-margin` only."""

    name: RuleName = "within-margin"
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ConfigError(f"--rule {self.name}: choose one of {', '.join(RULES)}")
        if not (math.isfinite(self.margin) and 0 <= self.margin < 1):
            raise ConfigError(f"--margin must be a top-1 difference in [0, 1), e.g. 0.01 for one point; got {self.margin}")

    def describe(self, objectives: Sequence[str], against: str = "DDP's top-1") -> str:
        """The rule in words, for a study of `objectives` (Optuna's metric names, top-1 first); `against`: what
        `within-margin` holds the trials against."""
        named = [OBJECTIVES[o] for o in objectives if o in OBJECTIVES]
        top1 = next((o for o in named if o.maximize), None)
        other = next((o for o in named if o is not top1), None)
        first_min = next((o for o in named if not o.maximize), None)
        default = " (the default)" if self == Rule() else ""
        if self.name == "within-margin" and top1 and other:
            best = "least" if not other.maximize else "highest"
            return (f"{self.name}{default}: of the Pareto front's trials within {self.margin:g} {top1.label} of "
                    f"{against}, the one with the {best} {other.label}")
        if self.name == "best-accuracy" and top1:
            return f"{self.name}{default}: the Pareto front's highest {top1.label}"
        if self.name == "least-traffic" and first_min:
            return f"{self.name}{default}: the Pareto front's least {first_min.label}"
        return f"{self.name}{default}: the Pareto front's trial closest to the ideal point, each objective scaled over the front"


DEFAULT_RULE = Rule()


def directions_of(objectives: Sequence[str]) -> list[StudyDirection]:
    """Optuna's directions of abtune objectives, by name."""
    return [StudyDirection.MAXIMIZE if OBJECTIVES[o].maximize else StudyDirection.MINIMIZE for o in objectives]


def pareto_front(trials: list[FrozenTrial], directions: list[StudyDirection]) -> list[FrozenTrial]:
    """The trials no other of them dominates on their values."""
    scores = [[_score(t, directions, i) for i in range(len(directions))] for t in trials]
    return [t for t, on_front in zip(trials, pareto_mask(scores), strict=True) if on_front]


def _score(trial: FrozenTrial, directions: list[StudyDirection], index: int) -> float:
    return signed(trial.values[index], directions[index] == StudyDirection.MAXIMIZE)


def promotable(trial: FrozenTrial) -> bool:
    """Not the ddp reference, and of a method that declares what it promotes (a study may also try other methods)."""
    searched = trial.params.get("method.name")  # unsearched: the study's base method, promotable or refused later
    return trial.user_attrs.get(REFERENCE_ATTR) != DDP and (searched is None or bool(METHOD_CONFIGS[searched].promoted_fields))


def top_single(trials: list[FrozenTrial], direction: StudyDirection, top: int, name: str) -> list[FrozenTrial]:
    if top > len(trials):
        raise ConfigError(f"--top {top}: study '{name}' has only {len(trials)} finished trial(s) "
                          "(ddp trials excluded); ask for fewer")
    reverse = direction == StudyDirection.MAXIMIZE
    return sorted(trials, key=lambda t: (t.value, -t.number if reverse else t.number), reverse=reverse)[:top]


def rank_front(front: list[FrozenTrial], directions: list[StudyDirection], rule: Rule,
               anchor: float | None = None) -> list[FrozenTrial]:
    """The front ranked by `rule` (see the module); top-1 is the first maximized objective. `anchor`: the
    top-1 `within-margin` holds the trials against (DDP's); None: the front's best."""
    if rule.name == "knee":
        return sorted(front, key=lambda t: (_distance_to_ideal(t, front, directions), t.number))
    if rule.name == "within-margin":
        return _within_margin(front, directions, rule.margin, anchor)
    wanted = StudyDirection.MAXIMIZE if rule.name == "best-accuracy" else StudyDirection.MINIMIZE
    if wanted not in directions:
        raise ConfigError(f"--rule {rule.name}: the study has no {wanted.name.lower()}d objective; "
                          f"choose one of {', '.join(RULES)}")
    return _by_objective(front, directions, directions.index(wanted))


def _by_objective(trials: list[FrozenTrial], directions: list[StudyDirection], index: int) -> list[FrozenTrial]:
    return sorted(trials, key=lambda t: (-_score(t, directions, index), t.number))


def _within_margin(front: list[FrozenTrial], directions: list[StudyDirection], margin: float,
                   anchor: float | None) -> list[FrozenTrial]:
    """Within `margin` of `anchor` (else of the best top-1): best on the other objective first (ties: higher
    top-1); then the rest by top-1."""
    if StudyDirection.MAXIMIZE not in directions:
        raise ConfigError(f"--rule within-margin: the study has no maximized objective (top-1); choose one of "
                          f"{', '.join(RULES)}")
    top1 = directions.index(StudyDirection.MAXIMIZE)
    other = next(i for i in range(len(directions)) if i != top1)
    best = max(t.values[top1] for t in front) if anchor is None else anchor
    near = [t for t in front if t.values[top1] >= best - margin - 1e-12]
    far = [t for t in front if t not in near]
    near.sort(key=lambda t: (-_score(t, directions, other), -t.values[top1], t.number))
    return near + _by_objective(far, directions, top1)


def _distance_to_ideal(trial: FrozenTrial, front: list[FrozenTrial], directions: list[StudyDirection]) -> float:
    total = 0.0
    for i, direction in enumerate(directions):
        values = [t.values[i] for t in front]
        low, high = min(values), max(values)
        scaled = 0.0 if high == low else (trial.values[i] - low) / (high - low)
        shortfall = 1.0 - scaled if direction == StudyDirection.MAXIMIZE else scaled
        total += shortfall**2
    return math.sqrt(total)
