"""What a study can optimize: one definition per objective, read by every part that names one.

An objective says how it is read from a finished run's summary, which way is better, and how it is
shown (column and axis label, unit, scale, digits). The study file's `objectives:` accepts exactly
these names; the trial stores each value under its name (`trial.user_attrs[name]`, for every
objective, optimized or not, so a study can be compared on any of them later); confirmation tables,
`study best`, Pareto plots and Optuna's metric names all take their words from here.

A leaf module (it reads only the run folder's contract): the study, the tracking plots and the
reports import it, and it imports none of them. Adding an objective is one new entry in OBJECTIVES
(see docs/layout.md, "Adding an objective").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from abtune.runfiles import RunSummary

EvaluationRow = dict[str, Any]  # one `evaluation` record of metrics.jsonl
Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Objective:
    name: str  # in the study file, as the trial attribute, as Optuna's metric name
    direction: Direction
    read: Callable[[RunSummary], float]  # from a finished run's summary.json
    # At an evaluation during the run: the value now (top-1) or the final value predicted from the run so
    # far (bytes); what intermediate values store and the multi-objective pruner ranks on. None: not
    # known before the run ends (such an objective cannot be pruned on).
    at_evaluation: Callable[[EvaluationRow], float | None] | None
    label: str  # a column or an axis, with its unit
    unit: str = ""  # after a shown value: MB, s, x
    scale: float = 1.0  # shown = value / scale
    digits: int = 4
    needs_multi_node: bool = False  # meaningless when every rank is on one node
    needs_base_keys: tuple[str, ...] = ()  # dotted keys of the study's base run config that must be set
    description: str = ""

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def score(self, value: float) -> float:
        """`value` turned so that higher is better: what Pareto dominance compares."""
        return signed(value, self.maximize)

    def show(self, value: float | None) -> str:
        if value is None:
            return "-"
        if math.isinf(value):
            return "never"
        return f"{value / self.scale:.{self.digits}f}"


def _extrapolated(key: str) -> Callable[[EvaluationRow], float | None]:
    """`key` at the run's last step, at the rate per step so far."""
    return lambda row: float(row[key]) * row["total_steps"] / row["step"] if row.get("step") else None


def _time_to_target(summary: RunSummary) -> float:
    """A run that never reached train.target_top1 took forever, as an objective to minimize."""
    seconds = summary.time_to_target_seconds
    return math.inf if seconds is None else float(seconds)


def _predicted_time_to_target(summary: RunSummary) -> float:
    seconds = summary.raw.get("predicted", {}).get("time_to_target_seconds")
    return math.inf if seconds is None else float(seconds)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("top1", "maximize", lambda s: float(s.final_top1), lambda row: float(row["val_top1"]), "top-1",  # type: ignore[arg-type]
              description="the final validation top-1"),
    Objective("inter_node_bytes", "minimize", lambda s: s.training_inter_node_bytes,
              lambda row: row.get("predicted_training_inter_node_bytes"), "inter-node MB", "MB", 1e6, 2,
              needs_multi_node=True,
              description="inter-node wire bytes per rank of the training phases (mean over ranks; evaluation, "
                          "set-up and checkpoint traffic excluded, so train.eval_every does not leak into the search)"),
    Objective("compression", "maximize", lambda s: s.compression, lambda row: row.get("model_compression"),
              "compression", "x", 1.0, 2,
              description="the compression of the model being trained as the AB paper reports it (AB: at the end "
                          "of the last AB phase; 1.0 for DDP)"),
    Objective("train_seconds", "minimize", lambda s: s.train_seconds, _extrapolated("train_seconds"),
              "train s", "s", 1.0, 1,
              description="training seconds (steps only: start-up, evaluations and checkpoints excluded)"),
    Objective("time_to_target", "minimize", _time_to_target, None, "s to target", "s", 1.0, 1,
              needs_base_keys=("train.target_top1",),
              description="training seconds until the first evaluation at or above train.target_top1 "
                          "(infinite when never reached)"),
    Objective("predicted_time_to_target", "minimize", _predicted_time_to_target, None, "predicted s to target",
              "s", 1.0, 2, needs_base_keys=("train.target_top1", "train.cluster"),
              description="predicted training seconds on the study's cluster (`cluster:` in the study file; "
                          "abtune/timing.py) until the step at which the run reached train.target_top1"),
)}

ObjectiveName = Literal[tuple(OBJECTIVES)]  # type: ignore[valid-type]  # the study file's `objectives:` accepts these


def signed(value: float, maximize: bool) -> float:
    """A value of an objective (or of an Optuna direction) as a score: higher is better."""
    return value if maximize else -value


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Score vector `a` is at least as good as `b` everywhere and better somewhere."""
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))


def pareto_mask(scores: Sequence[Sequence[float]]) -> list[bool]:
    """For each score vector (Objective.score of every component), whether no other dominates it. Equal
    vectors are all on the front; one with a NaN is on none.

    Sorted best-first, a vector can only be dominated by one before it. Two components (a study's usual
    pair) take one sweep, O(n log n); more compare each vector with the front found so far, which keeps
    `study best` and the study plots fast at thousands of trials."""
    mask = [False] * len(scores)
    order = sorted((i for i, v in enumerate(scores) if not any(math.isnan(x) for x in v)),
                   key=lambda i: tuple(-x for x in scores[i]))
    if scores and len(scores[0]) == 2:
        beaten_below: float | None = None  # the best second component among vectors with a better first one
        for _, group in itertools.groupby(order, key=lambda i: scores[i][0]):
            members = list(group)
            top = scores[members[0]][1]
            for i in members:
                mask[i] = scores[i][1] == top and (beaten_below is None or top > beaten_below)
            beaten_below = top if beaten_below is None else max(beaten_below, top)
        return mask
    front: list[Sequence[float]] = []
    for i in order:
        if not any(dominates(other, scores[i]) for other in front):
            mask[i] = True
            front.append(scores[i])
    return mask


def non_dominated_fronts(scores: Mapping[int, Sequence[float]]) -> list[list[int]]:
    """The keys of NaN-free score vectors by front: the Pareto front, then the front of the rest, ..."""
    remaining = dict(scores)
    fronts = []
    while remaining:
        keys = list(remaining)
        front = sorted(k for k, on_front in zip(keys, pareto_mask([remaining[k] for k in keys]), strict=True) if on_front)
        assert front, "a score vector with a NaN is on no front"
        fronts.append(front)
        for key in front:
            del remaining[key]
    return fronts
