"""Reading a study: status, the best configuration and the Pareto front, exports, the list of studies."""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections import Counter
from collections.abc import Sequence
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.table import Table

from abtune.errors import ConfigError
from abtune.launch.launchers import launcher_type
from abtune.objectives import OBJECTIVES
from abtune.study import curves, importance, repeats, results, workers
from abtune.study.attrs import (
    ATTEMPT_ATTR,
    FAIL_REASON_ATTR,
    JOB_ATTRS,
    LAUNCHER_ATTR,
    LOCAL_JOB_ATTR,
    OVER_BUDGET_ATTR,
    REFERENCE_ATTR,
    RETRY_OF_ATTR,
    REUSED_SEEDS_ATTR,
    RUN_DIR_ATTR,
    SEEDS_ATTR,
    SLURM_JOB_ATTR,
)
from abtune.study.definition import DDP, PAPER_DEFAULTS, stored_spec, stored_study_dir
from abtune.study.display import with_spread
from abtune.study.spec import StudySpec
from abtune.study.stop import WORKER_JOBS_ATTR

MEGA = 1e6
EXPORTED_ATTRS = (REFERENCE_ATTR, RETRY_OF_ATTR, ATTEMPT_ATTR, *results.RESULT_KEYS, "traffic_excess_mb",
                  FAIL_REASON_ATTR, RUN_DIR_ATTR, SLURM_JOB_ATTR)


def _console() -> Console:
    return Console(highlight=False, width=200, soft_wrap=True)


def _waiting_notes(storage: BaseStorage, study_id: int, trials: list[FrozenTrial]) -> dict[int, str]:
    """Why each running trial's job waits, as its launcher can tell (SLURM: state and pending reason)."""
    worker_jobs = storage.get_study_system_attrs(study_id).get(WORKER_JOBS_ATTR, [])
    notes: dict[int, str] = {}
    for kind, attr in JOB_ATTRS.items():
        jobs = {t.number: str(t.user_attrs[attr]) for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get(attr)}
        if jobs:
            notes.update(launcher_type(kind).waiting_notes(jobs, worker_jobs))
    return notes


def print_status(storage: BaseStorage, name: str, url: str) -> None:
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
            owner = workers.describe(trial.system_attrs.get(workers.WORKER_ATTR))
            job = trial.user_attrs.get(SLURM_JOB_ATTR)
            local = trial.user_attrs.get(LOCAL_JOB_ATTR)
            where = f" in SLURM job {job}" if job else f" in local job {local['pid']}" if local else ""
            note = f": {notes[trial.number]}" if trial.number in notes else ""
            console.print(f"running: trial {trial.number}{where} on {owner} since {trial.datetime_start:%H:%M:%S}{note}")
    best = results.best_trial(trials)
    if best is not None:
        seeds = best.user_attrs.get("top1_seeds")
        noise = f" ± {best.user_attrs['top1_std']:.4f} over {len(seeds)} seeds" if seeds else ""
        console.print(f"best so far: trial {best.number}, top-1 {best.user_attrs['top1']:.4f}{noise}")
    for inert in importance.inert_parameters(trials, list(spec.space), importance.shown_objectives(spec)):
        console.print(f"warning: {inert.describe()}")


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


def trial_table(title: str, trials: Sequence[FrozenTrial], all_trials: Sequence[FrozenTrial],
                spec: StudySpec) -> Table:
    """The fixed columns (top-1 vs the paper defaults, inter-node MB vs DDP, compression), then every other
    objective the study optimizes, then the searched parameters."""
    ddp, paper = results.reference(all_trials, DDP), results.reference(all_trials, PAPER_DEFAULTS)
    more = [OBJECTIVES[m] for m in spec.objectives if m not in SHOWN_ALWAYS]
    table = Table("trial", "top1", "vs paper", "inter MB", "vs DDP", "compr", *(o.label for o in more), *spec.space,
                  "note", title=title)
    for trial in trials:
        a = trial.user_attrs
        params = [_format(trial.params.get(p, "-")) for p in spec.space]
        table.add_row(str(trial.number), with_spread(f"{a['top1']:.4f}", a, "top1"),
                      _delta(a["top1"], paper, "top1", ratio=False),
                      with_spread(f"{a['inter_node_bytes'] / MEGA:.2f}", a, "inter_node_bytes", MEGA),
                      _delta(a["inter_node_bytes"], ddp, "inter_node_bytes", True),
                      f"{a['compression']:.2f}", *(o.show(a.get(o.name)) for o in more), *params, results.label(trial))
    return table


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_best(storage: BaseStorage, name: str) -> None:
    study_id = storage.get_study_id_from_name(name)
    spec, trials = stored_spec(storage, study_id), storage.get_all_trials(study_id, deepcopy=False)
    console = _console()
    best = results.best_trial(trials)
    if best is None:
        console.print(f"study {name} has no completed search trial yet" + _why_none(trials, spec))
        return
    console.print(trial_table("best configuration (highest final top-1)", [best], trials, spec))
    console.print(f"run it again: {rerun_command(best, spec)}")
    metrics = importance.shown_objectives(spec)
    front = results.pareto_front([t for t in results.search_trials(trials) if results.feasible(t)], metrics)
    console.print(front_table(name, metrics, front, trials, spec))
    early = curves.describe(curves.early_vs_final(results.search_trials(trials)))
    if early:
        console.print(early)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if pruned:
        console.print(f"{len(pruned)} trial(s) pruned ({spec.pruner.name}; stopped early, so never on the front): "
                      + ", ".join(f"{t.number} at step {t.user_attrs.get('steps_done', '?')}" for t in pruned))
    refs = [t for t in (results.reference(trials, PAPER_DEFAULTS), results.reference(trials, DDP)) if t is not None]
    if refs:
        console.print(trial_table("reference trials", refs, trials, spec))
    print_importances(console, importance.analysis(trials, list(spec.space), metrics))


def front_table(name: str, metrics: Sequence[str], front: Sequence[FrozenTrial], all_trials: Sequence[FrozenTrial],
                spec: StudySpec) -> Table:
    """The front's first FRONT_ROWS trials (best top-1 first); the title says how many there are."""
    title = f"Pareto front ({', '.join(metrics)}): {len(front)} trial(s)"
    if len(front) > FRONT_ROWS:
        title += f", the {FRONT_ROWS} with the best top-1 shown (every trial: abtune study export {name})"
    return trial_table(title, front[:FRONT_ROWS], all_trials, spec)


def print_importances(console: Console, analysis: dict[str, Any]) -> None:
    """Optuna's parameter importances per objective, then one line per searched parameter that changed nothing."""
    values = analysis["importances"]
    if values is None:
        console.print(f"parameter importances: not yet ({analysis['importances_missing']})")
    else:
        objectives = list(values)
        table = Table("parameter", *objectives, title="parameter importances (Optuna's default evaluator, per objective)")
        params = sorted({p for by in values.values() for p in by}, key=lambda p: -max(by.get(p, 0.0) for by in values.values()))
        inert = {i["param"] for i in analysis["inert"]}  # Optuna may credit one with what a correlated parameter did
        for param in params:
            table.add_row(param + (" (changed nothing)" if param in inert else ""),
                          *(f"{values[o].get(param, 0.0):.3f}" for o in objectives))
        console.print(table)
        for objective, reason in analysis.get("importances_skipped", {}).items():
            console.print(f"parameter importances for {objective}: none ({reason})")
    for inert in analysis["inert"]:
        console.print(f"warning: {inert['message']}")


def rerun_command(trial: FrozenTrial, spec: StudySpec) -> str:
    """`abtune train` of the trial's config where it ran: its SLURM profile (which sets nodes and tasks), or
    local processes in the study's layout (through the trial's local profile, e.g. the emulated fabric)."""
    attrs = trial.user_attrs
    command = ["abtune", "train", f"{attrs[RUN_DIR_ATTR]}/config.yaml"]
    launcher = attrs.get(LAUNCHER_ATTR)
    if attrs.get(SLURM_JOB_ATTR):
        return shlex.join([*command, "--launcher", launcher or "slurm"])
    via = ["--launcher", launcher] if launcher not in (None, "local") else []
    return shlex.join([*command, *via, "--nproc", str(spec.layout.nproc), "--ranks-per-node", str(spec.layout.per_node)])


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
    table = Table("study", "objectives", "trials", "finished", "best top1", "created", title=f"studies in {url}")
    for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
        best = results.best_trial(trials)
        try:
            spec = stored_spec(storage, study._study_id)
            objectives, budget = ", ".join(spec.objectives), f"{spec.trials}"
        except ConfigError:  # a study made by plain Optuna: listed, but it has no abtune definition
            objectives, budget = "(not an abtune study)", "-"
        first = min((t.datetime_start for t in trials if t.datetime_start), default=None)
        table.add_row(study.study_name, objectives, budget, str(results.finished_count(trials)),
                      f"{best.user_attrs['top1']:.4f}" if best else "-", f"{first:%Y-%m-%d %H:%M}" if first else "-")
    _console().print(table)
