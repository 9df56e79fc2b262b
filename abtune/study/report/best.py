"""`abtune study best`: the study's recommendation (study/recommendation.py: held against DDP, stored once),
the Pareto front it was chosen from, the reference trials and the parameter importances."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from abtune import tables
from abtune.attrs import (
    DDP,
    PAPER_DEFAULTS,
)
from abtune.study import curves, importance, recommendation, results
from abtune.study.definition import stored_spec
from abtune.study.ranking import DEFAULT_RULE, Rule
from abtune.study.report.importances import print_importances
from abtune.study.report.rerun import repeated_faults_note, rerun_command
from abtune.study.report.trial_tables import print_front, print_trials
from abtune.study.spec import StudySpec


def print_best(storage: BaseStorage, name: str, rule: Rule, *, wide: bool = False) -> None:
    """The study's recommendation (held against DDP), the Pareto front, the reference trials and the importances."""
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    console = tables.console()
    answer = recommendation.current(optuna.load_study(study_name=name, storage=storage), rule)
    if answer is None or results.best_trial(trials) is None:
        console.print(f"study {name} has no completed search trial yet" + _why_none(trials, spec))
        return
    by_number = {t.number: t for t in trials}
    chosen = by_number[answer.trial]
    print_recommendation(console, answer, rule)
    print_trials(console, "recommended configuration" if answer.held != recommendation.SHORT else
                 "closest configuration (not recommended)", [chosen], trials, spec, wide=wide)
    console.print(f"run it again: {rerun_command(chosen, spec)}", soft_wrap=True)
    if note := repeated_faults_note(chosen):
        console.print(note, soft_wrap=True)
    metrics = importance.shown_objectives(spec)
    print_front(console, name, metrics, recommendation.search_front(trials, spec), trials, spec, wide=wide)
    early = curves.describe(curves.early_vs_final(results.search_trials(trials)))
    if early:
        console.print(early)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if pruned:
        console.print(f"{len(pruned)} trial(s) pruned ({spec.pruner.name}; stopped early, so never on the front): "
                      + ", ".join(f"{t.number} at step {t.user_attrs.get('steps_done', '?')}" for t in pruned))
    refs = [t for t in (results.reference(trials, PAPER_DEFAULTS), results.reference(trials, DDP)) if t is not None]
    if refs:
        print_trials(console, "reference trials", refs, trials, spec, wide=wide, labelled=True)
    print_importances(console, importance.study_analysis(storage, study_id, trials, list(spec.space), metrics))


def print_recommendation(console: Console, answer: recommendation.Recommendation, rule: Rule,
                         lead: str = "recommended") -> None:
    """The recommendation's lines as every command prints them, the trade against the highest top-1, the
    margin against the study's resolution and noise."""
    for line in answer.lines(lead):
        console.print(line)
    trade = answer.trade()
    if trade:
        console.print(trade)
    if rule != DEFAULT_RULE:
        console.print(f"(--rule {rule.name} --margin {rule.margin:g} asked for; the study's stored recommendation "
                      "uses the default rule)")
    console.print(resolution_line(answer))
    for warning in answer.noise_warnings():
        console.print(warning)


def resolution_line(answer: recommendation.Recommendation) -> str:
    """The margin beside what the study can resolve: one validation image, the seed-to-seed spread."""
    image = f"one validation image is {answer.resolution:.4f} top-1" if answer.resolution else \
        "one validation image's share of top-1 is not recorded"
    spread = f"seed-to-seed spread (std) {answer.spread:.4f}" if answer.spread is not None else \
        "seed-to-seed spread not measured (repeats: or abtune study confirm measure it)"
    return f"margin {answer.margin:g} top-1; {image}; {spread}"


def _why_none(trials: Sequence[FrozenTrial], spec: StudySpec) -> str:
    """Completed search trials exist but none is best: they all broke the traffic budget."""
    budget = spec.constraints.max_inter_node_mb
    if budget is not None and results.search_trials(trials):
        return f" within the traffic budget of {budget:g} inter-node MB per rank (constraints.max_inter_node_mb)"
    return ""
