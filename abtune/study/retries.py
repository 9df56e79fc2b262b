"""Failed trials that run again: a retry is a WAITING trial with the same parameters.

Kinds: `stale` (its worker died; `retries.stale` times), `hung` (its ranks stopped making
progress, abtune/training/hang.py: a dead link or a frozen node, likely gone on the next try;
`retries.hung` times), `failed` (its run failed otherwise; `retries.failed` times) and
`interrupted` (Ctrl-C; always, and not counted as an attempt). The
failed trial keeps its FAIL state and `fail_reason`, gets `retried: true` and leaves the budget
to its retry, whose `retry_of` names it (the runner resumes from its checkpoint).

Every comparison reads the reference trials (DDP, paper defaults): a failed reference run is retried at
least once whatever `retries.failed` says, and one whose last attempt failed anyway is enqueued again by
the next `abtune study run` (`lost_references`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import (
    ATTEMPT_ATTR,
    FAIL_REASON_ATTR,
    OVER_BUDGET_ATTR,
    REFERENCE_ATTR,
    RETRIED_ATTR,
    RETRY_OF_ATTR,
)
from abtune.study import workers
from abtune.study.optuna_private import storage_of, trial_id
from abtune.study.spec import StudySpec
from abtune.training.hang import is_hang

STALE, HUNG, FAILED, INTERRUPTED = "stale", "hung", "failed", "interrupted"
REFERENCE_FAILED_RETRIES = 1  # at least, for a reference trial's failed run


def failure_kind(reason: str | None) -> str:
    """A failed run's kind of retry, from its one line."""
    return HUNG if is_hang(reason) else FAILED


def allowed(spec: StudySpec, trial: FrozenTrial, kind: str | None) -> bool:
    limits = {STALE: spec.retries.stale, HUNG: spec.retries.hung, FAILED: spec.retries.failed, INTERRUPTED: None}
    if kind not in limits:
        return False
    limit = limits[kind]
    if kind == FAILED and trial.user_attrs.get(REFERENCE_ATTR):
        limit = max(limit, REFERENCE_FAILED_RETRIES)
    return limit is None or int(trial.user_attrs.get(ATTEMPT_ATTR, 0)) < limit


def enqueue(study: optuna.Study, trial: FrozenTrial, kind: str | None) -> None:
    attempt = int(trial.user_attrs.get(ATTEMPT_ATTR, 0)) + (0 if kind == INTERRUPTED else 1)
    user_attrs: dict[str, Any] = {RETRY_OF_ATTR: trial.number, ATTEMPT_ATTR: attempt}
    if trial.user_attrs.get(REFERENCE_ATTR):
        user_attrs[REFERENCE_ATTR] = trial.user_attrs[REFERENCE_ATTR]
    study.enqueue_trial(params=dict(trial.params), user_attrs=user_attrs)


def lost_references(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Reference trials whose latest attempt failed with no retry (failed more often than retried, or in
    a study run before references were retried): `abtune study run` enqueues each again."""
    latest: dict[str, FrozenTrial] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.user_attrs.get(REFERENCE_ATTR) and not trial.user_attrs.get(OVER_BUDGET_ATTR):  # never run
            latest[trial.user_attrs[REFERENCE_ATTR]] = trial
    return [t for t in latest.values() if t.state == TrialState.FAIL and not t.user_attrs.get(RETRIED_ATTR)]


def fail_stale(study: optuna.Study, spec: StudySpec, trial: FrozenTrial) -> str | None:
    """Fail a dead worker's RUNNING trial and re-enqueue it; None when another worker got there first."""
    owner = workers.describe(workers.owner_of(trial))
    retry = allowed(spec, trial, STALE)
    if not fail_unfollowed(study, trial, f"stale: its worker {owner} stopped (crash or kill)", STALE if retry else None):
        return None
    return f"trial {trial.number} was left RUNNING by {owner}: failed" + (", re-enqueued" if retry else "")


def fail_unfollowed(study: optuna.Study, trial: FrozenTrial, reason: str, retry_kind: str | None) -> bool:
    """FAIL a RUNNING trial no worker follows, re-enqueued as `retry_kind` unless None; False when
    another process finished it first. The state change is the claim: the storage lets exactly one
    process move RUNNING to FAIL."""
    storage = storage_of(study)
    try:
        storage.set_trial_user_attr(trial_id(trial), FAIL_REASON_ATTR, reason)
        if retry_kind is not None:
            storage.set_trial_user_attr(trial_id(trial), RETRIED_ATTR, True)
        claimed = storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        claimed = False
    if claimed and retry_kind is not None:
        enqueue(study, storage.get_trial(trial_id(trial)), retry_kind)
    return claimed
