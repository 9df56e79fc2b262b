"""What a trial's run produced, in the study's terms; the budget; the Pareto front.

Every objective of abtune/objectives.py is stored on the trial under its name, optimized or not.
Beside them: `best_top1`, `validation_images`, `ecr` (equation 4's estimated communication reduction (%) from the
compression, recorded, not optimized), the steps done, whether it stopped early, its wall seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import (
    DDP,
    FIRST_RANKS_ATTR,
    OVER_BUDGET_ATTR,
    PAPER_DEFAULTS,
    REFERENCE_ATTR,
    RETRIED_ATTR,
    RETRY_OF_ATTR,
    SCHEDULE_ATTR,
    TRAFFIC_EXCESS_ATTR,
)
from abtune.objectives import OBJECTIVES, pareto_mask
from abtune.runfiles import RunSummary

VALIDATION_IMAGES = "validation_images"  # images of the last evaluation: top-1's resolution is 1 / this
RECORDED_KEYS = ("best_top1", "ecr", "steps_done", "stopped_early", "wall_seconds", VALIDATION_IMAGES)
RESULT_KEYS = (*OBJECTIVES, *RECORDED_KEYS)
# What AB decided (abtune/attrs.py): stored on the trial, not exported as columns.
DIAGNOSTIC_KEYS = (FIRST_RANKS_ATTR, SCHEDULE_ATTR)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def result_attrs(summary: RunSummary, wall_seconds: float) -> dict[str, Any]:
    return {
        **{name: objective.read(summary) for name, objective in OBJECTIVES.items()},
        "best_top1": summary.best_top1,
        "ecr": summary.ecr_percent,
        "steps_done": summary.steps_done,
        "stopped_early": summary.stopped_early,
        "wall_seconds": wall_seconds,
        VALIDATION_IMAGES: summary.validation_images,
        "first_ranks": summary.first_decomposition_ranks,
        "schedule_steps": summary.schedule,
        "predicted_compute_source": summary.raw.get("predicted", {}).get("compute_source"),
    }




def replaced(trial: FrozenTrial) -> bool:
    """A failed trial that does not count against the budget: it was re-enqueued (its retry takes its
    place), or a worker asked for it while another took the last trial of the budget (never run)."""
    return trial.state == TrialState.FAIL and bool(trial.user_attrs.get(RETRIED_ATTR) or trial.user_attrs.get(OVER_BUDGET_ATTR))


def budget_used(trials: Sequence[FrozenTrial]) -> int:
    """Trials that count against the study's budget: every trial but the replaced ones (waiting included)."""
    return sum(1 for t in counted(trials))


def finished_count(trials: Sequence[FrozenTrial]) -> int:
    return sum(1 for t in counted(trials) if t.state in FINISHED)


def counted(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that count against the budget: not replaced, and no failed trial that a later one retries
    (a reference enqueued again by a later `study run`, when the failed trial could no longer be marked)."""
    retried = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials} - {None}
    return [t for t in trials if not replaced(t) and not (t.state == TrialState.FAIL and t.number in retried)]


def reference(trials: Sequence[FrozenTrial], kind: str) -> FrozenTrial | None:
    done = [t for t in trials if t.user_attrs.get(REFERENCE_ATTR) == kind and t.state == TrialState.COMPLETE]
    return done[-1] if done else None


def search_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Completed trials inside the search space (the paper-defaults trial is one; DDP is not)."""
    return [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get(REFERENCE_ATTR) != DDP
            and "top1" in t.user_attrs]


def feasible(trial: FrozenTrial) -> bool:
    return float(trial.user_attrs.get(TRAFFIC_EXCESS_ATTR, 0.0)) <= 0.0


def pareto_front(trials: Sequence[FrozenTrial], metrics: Sequence[str]) -> list[FrozenTrial]:
    """Trials no other trial beats on every metric (directions from abtune/objectives.py), best top-1 first."""
    scored = [t for t in trials if all(m in t.user_attrs for m in metrics)]
    scores = [[OBJECTIVES[m].score(float(t.user_attrs[m])) for m in metrics] for t in scored]
    front = [t for t, on_front in zip(scored, pareto_mask(scores), strict=True) if on_front]
    return sorted(front, key=lambda t: (-t.user_attrs["top1"], t.number))


def best_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """Highest final top-1 among feasible completed search trials (fewer bytes breaks ties)."""
    candidates = [t for t in search_trials(trials) if feasible(t)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.user_attrs["top1"], -t.user_attrs["inter_node_bytes"], -t.number))


def label(trial: FrozenTrial) -> str:
    ref = trial.user_attrs.get(REFERENCE_ATTR)
    retry = trial.user_attrs.get(RETRY_OF_ATTR)
    text = {PAPER_DEFAULTS: "paper defaults", DDP: "DDP reference"}.get(ref, "")
    if retry is not None:
        text = f"{text} retry of {retry}".strip()
    if trial.state == TrialState.PRUNED:  # its figures are those of the step it stopped at
        text = f"{text} pruned at step {trial.user_attrs.get('steps_done', '?')}".strip()
    return text
