"""Reading a study: status, the best configuration and the Pareto front, exports, the list of studies."""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from abtune import tables
from abtune.attrs import (
    ATTEMPT_ATTR,
    DDP,
    FAIL_REASON_ATTR,
    JOB_ATTR,
    LAUNCHER_ATTR,
    OVER_BUDGET_ATTR,
    PAPER_DEFAULTS,
    REFERENCE_ATTR,
    RETRIED_ATTR,
    RETRY_OF_ATTR,
    REUSED_SEEDS_ATTR,
    RUN_DIR_ATTR,
    SEEDS_ATTR,
    TRAFFIC_EXCESS_ATTR,
)
from abtune.errors import ConfigError
from abtune.launch.launchers import describe_job, job_id, launcher_type, recorded_job, rerun_args
from abtune.objectives import OBJECTIVES
from abtune.study import curves, importance, repeats, results, workers
from abtune.study.definition import stored_spec, stored_study_dir
from abtune.study.display import with_spread
from abtune.study.ranking import DEFAULT_RULE, Rule, directions_of, rank_front
from abtune.study.spec import StudySpec
from abtune.study.stop import worker_jobs

MEGA = 1e6
FAILURES_SHOWN = 3  # `study status` lists the latest failed trials with their reasons
EXPORTED_ATTRS = (REFERENCE_ATTR, RETRY_OF_ATTR, ATTEMPT_ATTR, *results.RESULT_KEYS, TRAFFIC_EXCESS_ATTR,
                  FAIL_REASON_ATTR, RUN_DIR_ATTR)


def _console() -> Console:
    return tables.console()


def _waiting_notes(storage: BaseStorage, study_id: int, trials: list[FrozenTrial]) -> dict[int, str]:
    """Why each running trial's job waits, as its launcher can tell (SLURM: state and pending reason)."""
    by_kind: dict[str, dict[int, str]] = {}
    for trial in trials:
        entry = recorded_job(trial.user_attrs) if trial.state == TrialState.RUNNING else None
        if entry is not None:
            by_kind.setdefault(entry["kind"], {})[trial.number] = job_id(entry)
    launched = worker_jobs(storage, study_id)
    notes: dict[int, str] = {}
    for kind, jobs in by_kind.items():
        notes.update(launcher_type(kind).waiting_notes(jobs, launched))
    return notes


def print_status(storage: BaseStorage, name: str, url: str, rule: Rule = DEFAULT_RULE) -> None:
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    states = Counter(t.state.name for t in trials)
    console = _console()
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
    _print_recommended_so_far(console, trials, spec, rule)
    for inert in importance.inert_parameters(trials, list(spec.space), importance.shown_objectives(spec)):
        console.print(f"warning: {inert.describe()}")


def _print_recommended_so_far(console: Console, trials: Sequence[FrozenTrial], spec: StudySpec, rule: Rule) -> None:
    """The trial `study best` would recommend now, its objectives, and the rule that chose it."""
    best = results.best_trial(trials)
    if best is None:
        return
    chosen, why = recommended(best, search_front(trials, spec), spec, rule)
    console.print(f"recommended so far: trial {chosen.number} ({_objective_values(chosen, spec)}), chosen by {why}")
    if chosen.number != best.number:
        console.print(_trade(chosen, best, spec))


def _objective_values(trial: FrozenTrial, spec: StudySpec) -> str:
    """`top-1 0.9528, inter-node MB 47.14`; a repeated trial's means, each with its spread over the seeds."""
    attrs = trial.user_attrs
    shown = [f"{o.label} {with_spread(o.show(attrs.get(o.name)), attrs, o.name, o.scale)}"
             for o in (OBJECTIVES[m] for m in importance.shown_objectives(spec))]
    seeds = attrs.get("top1_seeds")
    return (f"mean over {len(seeds)} seeds: " if seeds else "") + ", ".join(shown)


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


def _delta(value: float, reference: FrozenTrial | None, key: str, ratio: bool) -> str:
    if reference is None or key not in reference.user_attrs:
        return "-"
    base = reference.user_attrs[key]
    if ratio:
        return f"{value / base:.2f}x" if base else "-"
    return f"{value - base:+.4f}"


SHOWN_ALWAYS = ("top1", "inter_node_bytes", "compression")  # with their deltas against the references
# `study best` prints this much of a front: ties make fronts of hundreds (853 of 944 2-step trials, issue 25)
FRONT_ROWS = 20


def print_trials(console: Console, title: str, trials: Sequence[FrozenTrial], all_trials: Sequence[FrozenTrial],
                 spec: StudySpec, *, wide: bool = False, labelled: bool = False) -> None:
    """The objectives and compression (top-1 vs the paper defaults, inter-node MB vs DDP), every other objective
    the study optimizes, the searched parameters, then a note; a narrow terminal drops the deltas against the
    paper defaults and the note first (`labelled`: the note names the rows, and stays)."""
    ddp, paper = results.reference(all_trials, DDP), results.reference(all_trials, PAPER_DEFAULTS)
    more = [OBJECTIVES[m] for m in spec.objectives if m not in SHOWN_ALWAYS]
    columns = [tables.Column("trial", justify="left"), tables.Column("top1"), tables.Column("vs paper", tables.KEY),
               tables.Column("inter MB"), tables.Column("vs DDP"), tables.Column("compr"),
               *(tables.Column(o.label) for o in more), *(tables.Column(p) for p in spec.space),
               tables.Column("note", tables.ESSENTIAL if labelled else tables.KEY, "left", wrap=not labelled)]
    rows = []
    for trial in trials:
        a = trial.user_attrs
        params = [_format(trial.params.get(p, "-")) for p in spec.space]
        rows.append([str(trial.number), with_spread(f"{a['top1']:.4f}", a, "top1"),
                     _delta(a["top1"], paper, "top1", ratio=False),
                     with_spread(f"{a['inter_node_bytes'] / MEGA:.2f}", a, "inter_node_bytes", MEGA),
                     _delta(a["inter_node_bytes"], ddp, "inter_node_bytes", True),
                     f"{a['compression']:.2f}", *(o.show(a.get(o.name)) for o in more), *params, results.label(trial)])
    if labelled:  # the note names each row: beside the trial number, never in a continuation
        columns.insert(1, columns.pop())
        rows = [[row[0], row[-1], *row[1:-1]] for row in rows]
    tables.print_table(console, title, columns, rows, wide=wide, elsewhere=f"abtune study export {spec.name} has "
                       "every trial's values")


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_best(storage: BaseStorage, name: str, rule: Rule, *, wide: bool = False) -> None:
    """The configuration `rule` recommends, the Pareto front, the reference trials and the importances."""
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    console = _console()
    best = results.best_trial(trials)
    if best is None:
        console.print(f"study {name} has no completed search trial yet" + _why_none(trials, spec))
        return
    metrics = importance.shown_objectives(spec)
    front = search_front(trials, spec)
    chosen, why = recommended(best, front, spec, rule)
    console.print(f"recommended: trial {chosen.number}, chosen by {why}")
    if chosen.number != best.number:
        console.print(_trade(chosen, best, spec))
    print_trials(console, "recommended configuration", [chosen], trials, spec, wide=wide)
    console.print(f"run it again: {rerun_command(chosen, spec)}", soft_wrap=True)
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


def _trade(chosen: FrozenTrial, best: FrozenTrial, spec: StudySpec) -> str:
    """What the recommendation gives up against the highest top-1, and what it saves."""
    top1 = OBJECTIVES["top1"]
    others = [OBJECTIVES[m] for m in spec.objectives if m != top1.name]
    saved = ", ".join(f"{o.label} {o.show(chosen.user_attrs.get(o.name))} instead of {o.show(best.user_attrs.get(o.name))}"
                      for o in others)
    return (f"the highest {top1.label} is trial {best.number}'s ({top1.show(best.user_attrs['top1'])}); trial "
            f"{chosen.number} has {top1.show(chosen.user_attrs['top1'])} at {saved}")


def print_front(console: Console, name: str, metrics: Sequence[str], front: Sequence[FrozenTrial],
                all_trials: Sequence[FrozenTrial], spec: StudySpec, *, wide: bool = False) -> None:
    """The front's first FRONT_ROWS trials (best top-1 first); the title says how many there are."""
    title = f"Pareto front ({', '.join(metrics)}): {len(front)} trial(s)"
    if len(front) > FRONT_ROWS:
        title += f", the {FRONT_ROWS} with the best top-1 shown (every trial: abtune study export {name})"
    print_trials(console, title, front[:FRONT_ROWS], all_trials, spec, wide=wide)


def print_importances(console: Console, analysis: dict[str, Any]) -> None:
    """Optuna's parameter importances per objective, then one line per searched parameter that changed nothing."""
    values = analysis["importances"]
    if values is None:
        console.print(f"parameter importances: not yet ({analysis['importances_missing']})")
    else:
        objectives = list(values)
        params = sorted({p for by in values.values() for p in by}, key=lambda p: -max(by.get(p, 0.0) for by in values.values()))
        inert = {i["param"] for i in analysis["inert"]}  # Optuna may credit one with what a correlated parameter did
        rows = [[param + (" (changed nothing)" if param in inert else ""),
                 *(f"{values[o].get(param, 0.0):.3f}" for o in objectives)] for param in params]
        columns = [tables.Column("parameter", justify="left", wrap=True),
                   *(tables.Column(o, justify="left") for o in objectives)]
        tables.print_table(console, "parameter importances (Optuna's default evaluator, per objective, over "
                           f"{analysis['search_trials']} search trials)", columns, rows)
        for objective, reason in analysis.get("importances_skipped", {}).items():
            console.print(f"parameter importances for {objective}: none ({reason})")
    for inert in analysis["inert"]:
        console.print(f"warning: {inert['message']}")


def rerun_command(trial: FrozenTrial, spec: StudySpec) -> str:
    """`abtune train` of the trial's config where it ran, as its job's launcher says (launch.launchers.rerun_args)."""
    attrs = trial.user_attrs
    where = rerun_args(recorded_job(attrs), attrs.get(LAUNCHER_ATTR), spec.layout.nproc, spec.layout.per_node)
    return shlex.join(["abtune", "train", f"{attrs[RUN_DIR_ATTR]}/config.yaml", *where])


def _why_none(trials: Sequence[FrozenTrial], spec: StudySpec) -> str:
    """Completed search trials exist but none is best: they all broke the traffic budget."""
    budget = spec.constraints.max_inter_node_mb
    if budget is not None and results.search_trials(trials):
        return f" within the traffic budget of {budget:g} inter-node MB per rank (constraints.max_inter_node_mb)"
    return ""


def export_rows(storage: BaseStorage, name: str) -> list[dict[str, Any]]:
    study_id = storage.get_study_id_from_name(name)
    spec = stored_spec(storage, study_id)
    rows = []
    for trial in storage.get_all_trials(study_id, deepcopy=False):
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name}
        values = trial.values or [None] * len(spec.objectives)
        row.update({f"value_{m}": v for m, v in zip(spec.objectives, values, strict=True)})
        row.update({f"param_{k}": trial.params.get(k) for k in spec.space})
        row.update({key: trial.user_attrs.get(key) for key in EXPORTED_ATTRS})
        entry = recorded_job(trial.user_attrs)
        row[JOB_ATTR] = describe_job(entry) if entry else None  # `SLURM job 812`, as its launcher names it
        if spec.repeats > 1:
            row.update({key: trial.user_attrs.get(key) for key in repeat_columns()})
        row["datetime_start"] = trial.datetime_start.isoformat() if trial.datetime_start else None
        row["datetime_complete"] = trial.datetime_complete.isoformat() if trial.datetime_complete else None
        rows.append(row)
    return rows


def repeat_columns() -> list[str]:
    """Export columns of a study with repeats: the seeds, and each result's spread and per-seed values."""
    return [SEEDS_ATTR, REUSED_SEEDS_ATTR,
            *(f"{key}_{part}" for key in repeats.SPREAD_KEYS for part in ("std", "seeds"))]


def export_text(storage: BaseStorage, name: str, fmt: str) -> str:
    rows = export_rows(storage, name)
    if fmt == "json":
        spec = stored_spec(storage, storage.get_study_id_from_name(name))
        return json.dumps({"study": name, "objectives": spec.objectives, "directions": spec.directions,
                           "definition": spec.model_dump(mode="json"), "trials": rows}, indent=2) + "\n"
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]) if rows else ["number", "state"])
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def print_list(storage: BaseStorage, url: str) -> None:
    columns = [tables.Column("study", justify="left", wrap=True), tables.Column("objectives", justify="left", wrap=True),
               tables.Column("trials"), tables.Column("finished"), tables.Column("best top1"),
               tables.Column("created", tables.KEY, "left", wrap=True)]
    rows = []
    for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
        best = results.best_trial(trials)
        try:
            spec = stored_spec(storage, study._study_id)
            objectives, budget = ", ".join(spec.objectives), f"{spec.trials}"
        except ConfigError:  # a study made by plain Optuna: listed, but it has no abtune definition
            objectives, budget = "(not an abtune study)", "-"
        first = min((t.datetime_start for t in trials if t.datetime_start), default=None)
        rows.append([study.study_name, objectives, budget, str(results.finished_count(trials)),
                     f"{best.user_attrs['top1']:.4f}" if best else "-", f"{first:%Y-%m-%d %H:%M}" if first else "-"])
    tables.print_table(_console(), f"studies in {url}", columns, rows)
