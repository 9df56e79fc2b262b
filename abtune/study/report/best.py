"""`abtune study best`: the configuration a rule recommends, the Pareto front it was chosen from, the
reference trials and the parameter importances."""

from __future__ import annotations

from collections.abc import Sequence

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune import tables
from abtune.attrs import (
    DDP,
    PAPER_DEFAULTS,
)
from abtune.objectives import OBJECTIVES
from abtune.study import curves, importance, results
from abtune.study.definition import stored_spec
from abtune.study.ranking import Rule, directions_of, rank_front
from abtune.study.report.importances import print_importances
from abtune.study.report.rerun import repeated_faults_note, rerun_command
from abtune.study.report.tables import print_front, print_trials
from abtune.study.spec import StudySpec


def print_best(storage: BaseStorage, name: str, rule: Rule, *, wide: bool = False) -> None:
    """The configuration `rule` recommends, the Pareto front, the reference trials and the importances."""
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    console = tables.console()
    best = results.best_trial(trials)
    if best is None:
        console.print(f"study {name} has no completed search trial yet" + _why_none(trials, spec))
        return
    metrics = importance.shown_objectives(spec)
    front = search_front(trials, spec)
    chosen, why = recommended(best, front, spec, rule)
    console.print(f"recommended: trial {chosen.number}, chosen by {why}")
    if chosen.number != best.number:
        console.print(trade(chosen, best, spec))
    print_trials(console, "recommended configuration", [chosen], trials, spec, wide=wide)
    console.print(f"run it again: {rerun_command(chosen, spec)}", soft_wrap=True)
    if note := repeated_faults_note(chosen):
        console.print(note, soft_wrap=True)
    print_front(console, name, metrics, front, trials, spec, wide=wide)
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
    print_importances(console, importance.analysis(trials, list(spec.space), metrics))


def search_front(trials: Sequence[FrozenTrial], spec: StudySpec) -> list[FrozenTrial]:
    """The Pareto front the recommendation is chosen from: feasible search trials on the study's objectives."""
    feasible = [t for t in results.search_trials(trials) if results.feasible(t)]
    return results.pareto_front(feasible, importance.shown_objectives(spec))


def recommended(best: FrozenTrial, front: Sequence[FrozenTrial], spec: StudySpec, rule: Rule) -> tuple[FrozenTrial, str]:
    """The trial `rule` ranks first on the front (one objective: the best feasible trial), and why, in words;
    what `abtune promote` carries by default."""
    if not spec.multi_objective or not front:
        budget = spec.constraints.max_inter_node_mb
        within = f" within the traffic budget of {budget:g} inter-node MB" if budget is not None else ""
        return best, f"one objective: the highest {OBJECTIVES['top1'].label}{within}"
    ranked = rank_front(list(front), directions_of(spec.objectives), rule)
    return ranked[0], f"rule {rule.describe(spec.objectives)} (--rule and --margin choose; abtune promote uses the same)"


def trade(chosen: FrozenTrial, best: FrozenTrial, spec: StudySpec) -> str:
    """What the recommendation gives up against the highest top-1, and what it saves."""
    top1 = OBJECTIVES["top1"]
    others = [OBJECTIVES[m] for m in spec.objectives if m != top1.name]
    saved = ", ".join(f"{o.label} {o.show(chosen.user_attrs.get(o.name))} instead of {o.show(best.user_attrs.get(o.name))}"
                      for o in others)
    return (f"the highest {top1.label} is trial {best.number}'s ({top1.show(best.user_attrs['top1'])}); trial "
            f"{chosen.number} has {top1.show(chosen.user_attrs['top1'])} at {saved}")


def _why_none(trials: Sequence[FrozenTrial], spec: StudySpec) -> str:
    """Completed search trials exist but none is best: they all broke the traffic budget."""
    budget = spec.constraints.max_inter_node_mb
    if budget is not None and results.search_trials(trials):
        return f" within the traffic budget of {budget:g} inter-node MB per rank (constraints.max_inter_node_mb)"
    return ""
