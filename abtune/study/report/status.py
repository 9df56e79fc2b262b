"""`abtune study status`: the budget, the running trials (where they run, why they wait, whether their worker
is gone), the latest failures and the recommendation so far."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from abtune import tables
from abtune.attrs import (
    FAIL_REASON_ATTR,
    OVER_BUDGET_ATTR,
    RETRIED_ATTR,
)
from abtune.launch.launchers import describe_job, job_id, job_queue, launcher_type, recorded_job
from abtune.study import importance, recommendation, results, workers
from abtune.study.definition import stored_spec, stored_study_dir
from abtune.study.ranking import DEFAULT_RULE, Rule
from abtune.study.report.best import print_recommendation
from abtune.study.stop import worker_jobs

FAILURES_SHOWN = 3  # `study status` lists the latest failed trials with their reasons


def print_status(storage: BaseStorage, name: str, url: str, rule: Rule = DEFAULT_RULE) -> None:
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    states = Counter(t.state.name for t in trials)
    console = tables.console()
    console.print(f"study {name}  ({', '.join(f'{m} {d}' for m, d in zip(spec.objectives, spec.directions, strict=True))})")
    console.print(f"storage {url}; trial folders {stored_study_dir(storage, study_id)}")
    console.print(f"budget {results.finished_count(trials)}/{spec.trials} finished; "
                  + ", ".join(f"{s.lower()} {n}" for s, n in sorted(states.items())))
    over = sum(1 for t in trials if results.replaced(t) and t.user_attrs.get(OVER_BUDGET_ATTR))
    replaced = sum(1 for t in trials if results.replaced(t)) - over
    if replaced:
        console.print(f"{replaced} failed trial(s) were re-enqueued and do not count against the budget")
    if over:
        console.print(f"{over} trial(s) asked for as others took the last of the budget were not run and do not count")
    notes = _waiting_notes(storage, study_id, trials)
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            console.print(_running_line(trial, notes.get(trial.number), spec.retries.stale_after_s))
    _print_failures(console, name, trials)
    _print_recommended_so_far(console, storage, name, trials, rule)
    for inert in importance.inert_parameters(trials, list(spec.space), importance.shown_objectives(spec)):
        console.print(f"warning: {inert.describe()}")


def _waiting_notes(storage: BaseStorage, study_id: int, trials: list[FrozenTrial]) -> dict[int, str]:
    """Why each running trial's job waits, as its launcher's queue can tell (its state and pending reason)."""
    by_kind: dict[str, dict[int, str]] = {}
    for trial in trials:
        entry = recorded_job(trial.user_attrs) if trial.state == TrialState.RUNNING else None
        if entry is not None:
            by_kind.setdefault(entry["kind"], {})[trial.number] = job_id(entry)
    launched = worker_jobs(storage, study_id)
    notes: dict[int, str] = {}
    for kind, jobs in by_kind.items():
        queue = job_queue(launcher_type(kind))
        if queue is not None:
            notes.update(queue.waiting_notes(jobs, launched))
    return notes


def _print_recommended_so_far(console: Console, storage: BaseStorage, name: str, trials: Sequence[FrozenTrial],
                              rule: Rule) -> None:
    """The study's recommendation as `study best` prints it."""
    if results.best_trial(trials) is None:
        return
    answer = recommendation.current(optuna.load_study(study_name=name, storage=storage), rule)
    if answer is not None:
        print_recommendation(console, answer, rule, lead="recommended so far")


def _running_line(trial: FrozenTrial, note: str | None, stale_after_s: float) -> str:
    owner = workers.describe(workers.owner_of(trial))
    entry = recorded_job(trial.user_attrs)
    where = f" in {describe_job(entry)}" if entry else ""
    line = f"running: trial {trial.number}{where} on {owner} since {trial.datetime_start:%H:%M:%S}"
    if note:
        line += f": {note}"
    if workers.is_stale(trial, stale_after_s):
        line += "; its worker is gone (the next `abtune study run` re-attaches its job or retries it)"
    return line


def _print_failures(console: Console, name: str, trials: Sequence[FrozenTrial]) -> None:
    """The latest failed trials and why, oldest first (the trials asked for beyond the budget, never run, aside)."""
    failed = [t for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get(OVER_BUDGET_ATTR)]
    if not failed:
        return
    failed.sort(key=lambda t: (t.datetime_complete or datetime.min, t.number))
    shown = failed[-FAILURES_SHOWN:]
    more = f" ({len(shown)} of {len(failed)}; every one: abtune study export {name})" if len(failed) > len(shown) else ""
    console.print(f"latest failures{more}:")
    for trial in shown:
        when = f" ({trial.datetime_complete:%H:%M:%S})" if trial.datetime_complete else ""
        retried = ", re-enqueued" if trial.user_attrs.get(RETRIED_ATTR) else ""
        console.print(f"  trial {trial.number}{when}{retried}: {trial.user_attrs.get(FAIL_REASON_ATTR, 'no reason recorded')}")
