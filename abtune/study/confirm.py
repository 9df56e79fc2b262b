"""`abtune study confirm NAME --top K --seeds S`: is the winner better, or only luckier?

Re-runs the K best configurations of the search (chosen by the rules of `abtune promote`: `--rule`)
and both reference trials (paper defaults, DDP) with S fresh seeds each: seed B + 1000 (R + j) for
j < S, where B is the base config's seed and R the study's `repeats`, so no confirmation seed was
seen by the search, and all configurations share the same seeds. Runs go to
STUDY_DIR/confirm/trial_N/seed_S/; a run whose summary.json exists is not run again (a confirmation
interrupted by Ctrl-C continues where it stopped).

The table holds, per objective (and inter-node bytes), mean +- std and the 95% t-interval of every
configuration, and its difference to the paper defaults and to DDP with a paired t-test over the
shared seeds (stats.TEST_NAME). Optuna cannot change the attributes of a finished trial, so the
results are study user attributes: `abtune.confirmation.trial_N` per configuration and
`abtune.confirmation` for the whole (seeds, rule, test, MLflow run). MLflow gets one run,
`confirmation`, with the table (markdown, JSON) and a plot of the intervals as artifacts.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from abtune.attrs import CONFIRMATION_ATTR, DDP, PAPER_DEFAULTS, REFERENCE_ATTR
from abtune.config import RunConfig, apply_overrides, parse_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.launch.base import Job, Launcher
from abtune.objectives import OBJECTIVES
from abtune.prose import say
from abtune.rundir import check_writable
from abtune.runfiles import read_summary, summary_path
from abtune.runs import Run
from abtune.study import recommendation, results, stats
from abtune.study.definition import stored_spec, stored_study_dir
from abtune.study.pool import JobPool
from abtune.study.ranking import Rule
from abtune.study.repeats import repeat_seed, seed_dir
from abtune.study.space import ddp_reference_config
from abtune.study.spec import StudySpec
from abtune.tracking import Tracking
from abtune.words import plural

CONFIRM_DIR = "confirm"
POLL_S = 0.5
LABELS = {PAPER_DEFAULTS: "paper defaults", DDP: "DDP"}


@dataclass
class Subject:
    """One configuration to confirm: the trial it comes from and why (candidate and/or a reference)."""

    trial: FrozenTrial
    roles: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        labels = [LABELS[r] for r in self.roles if r in LABELS]
        return f"trial {self.trial.number}" + (f" ({', '.join(labels)})" if labels else "")

    def folder(self, study_dir: Path) -> Path:
        return study_dir / CONFIRM_DIR / f"trial_{self.trial.number}"


def subjects(study: optuna.Study, top: int, rule: Rule) -> list[Subject]:
    """The K best trials, then the paper-defaults and DDP trials (a reference among the best counts once)."""
    trials = study.get_trials(deepcopy=False)
    paper, ddp = results.reference(trials, PAPER_DEFAULTS), results.reference(trials, DDP)
    if paper is None and ddp is None:
        raise ConfigError(f"study {study.study_name} has no finished reference trial (paper defaults, DDP) to "
                          "compare with; run it with references enabled")
    chosen: dict[int, Subject] = {}
    for trial, role in [(t, "candidate") for t in _candidates(study, top, rule)] + [(paper, PAPER_DEFAULTS),
                                                                                     (ddp, DDP)]:
        if trial is not None:
            chosen.setdefault(trial.number, Subject(trial)).roles.append(role)
    return list(chosen.values())


def _candidates(study: optuna.Study, top: int, rule: Rule) -> list[FrozenTrial]:
    """The first K of the search's recommendation (the search's values, whatever was confirmed before)."""
    answer = recommendation.decide(study, rule, search_only=True)
    if answer is None:
        recommendation.require(study, rule)  # says why there is none
    assert answer is not None
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    return [by_number[n] for n in recommendation.top(study, answer, top)]


def confirmation_seeds(spec: StudySpec, count: int) -> list[int]:
    return [repeat_seed(int(spec.base.get("seed", 0)), spec.repeats + j) for j in range(count)]


def subject_config(spec: StudySpec, study_name: str, subject: Subject, seed: int) -> RunConfig:
    trial = subject.trial
    raw = ddp_reference_config(spec) if trial.user_attrs.get(REFERENCE_ATTR) == DDP else apply_overrides(spec.base, trial.params)
    raw = {**raw, "name": f"{study_name}-confirm-{trial.number}", "seed": seed}
    return parse_run_config(raw, f"confirmation of trial {trial.number}")


# --- running ----------------------------------------------------------------------------------------
def run_seeds(spec: StudySpec, study_name: str, study_dir: Path, chosen: list[Subject], seeds: list[int],
              launcher: Launcher, parallel: int) -> None:
    """Every (configuration, seed) run without a summary.json, `parallel` at a time; raises when any failed."""
    from abtune.study.trials import submit_trial, trial_job_name, trial_layout

    layout = trial_layout(spec, launcher)
    pending = [(s, seed) for s in chosen for seed in seeds if not summary_path(seed_dir(s.folder(study_dir), seed)).exists()]
    done = len(chosen) * len(seeds) - len(pending)
    say(f"confirming {plural(len(chosen), 'configuration')} x {plural(len(seeds), 'seed')}: "
        f"{plural(len(pending), 'run')} to train" + (f", {done} already done" if done else ""))

    def start(item: tuple[Subject, int]) -> Job:
        subject, seed = item
        run_dir = seed_dir(subject.folder(study_dir), seed)
        shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted earlier attempt starts over
        run = Run.prepare(subject_config(spec, study_name, subject, seed), run_dir, launcher, layout, hooks=[])
        return submit_trial(run, spec, trial_job_name(study_name, f"confirm-{subject.trial.number}-seed{seed}"))

    pool = JobPool(parallel, start, pending)
    failed: list[str] = []
    with SeedProgress(len(pending)) as progress:
        try:
            while pool.busy:
                pool.fill()
                progress.running([f"{subject.name} seed {seed}" for (subject, seed), _ in pool.running])
                for (subject, seed), ended in pool.poll():
                    progress.ended(f"{subject.name} seed {seed}", ended.ok, ended.reason)
                    if not ended.ok:
                        failed.append(f"{subject.name} seed {seed} ({ended.reason})")
                time.sleep(POLL_S if pool.running else 0)
        except KeyboardInterrupt:
            pool.cancel()
            raise
    if failed:
        raise AbtuneError(f"{len(failed)} confirmation run(s) failed: {'; '.join(failed)}; run the command "
                          "again to retry them (finished runs are kept)")


class SeedProgress:
    """The confirmation's runs as they end: on a terminal a progress bar (runs done of all, what runs now,
    elapsed time) with failures printed above it; elsewhere (logs, CI) one line per ended run."""

    BAR_COLUMNS = 50  # what the bar takes before the running runs' names: title, bar, count, time

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from abtune import tables

        self.console = tables.console()
        self.bar = Progress(TextColumn("[bold]confirming[/]"), BarColumn(bar_width=20), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[now]}"), console=self.console,
                            transient=False) if self.console.is_terminal and total else None
        self.task = self.bar.add_task("runs", total=total, now="") if self.bar is not None else None

    def __enter__(self) -> SeedProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.running([])  # the bar's last state: nothing runs any more
            self.bar.stop()

    def running(self, names: list[str]) -> None:
        """What runs now beside the bar: the runs by name when they fit, else how many."""
        if self.bar is not None and self.task is not None:
            listed = f"running {', '.join(names)}"
            shown = listed if len(listed) <= self.console.width - self.BAR_COLUMNS else f"running {len(names)}"
            self.bar.update(self.task, now=shown if names else "")

    def ended(self, name: str, ok: bool, reason: str | None) -> None:
        line = f"{name}: " + ("done" if ok else f"failed: {reason}")
        if self.bar is None:
            print(line, flush=True)
            return
        if self.task is not None:
            self.bar.advance(self.task)
        if not ok:
            self.bar.console.print(line, markup=False)


# --- the statistics ---------------------------------------------------------------------------------
def confirmation_metrics(spec: StudySpec) -> list[str]:
    return [*spec.objectives, *(["inter_node_bytes"] if "inter_node_bytes" not in spec.objectives else [])]


def seed_values(folder: Path, seeds: list[int], metrics: list[str]) -> dict[str, list[float]]:
    attrs = [results.result_attrs(read_summary(seed_dir(folder, s)), 0.0) for s in seeds]
    values = {m: [float(a[m]) for a in attrs] for m in metrics}
    images = attrs[0].get(results.VALIDATION_IMAGES)
    if images:
        values[results.VALIDATION_IMAGES] = [float(images)]
    return values


def record(subject: Subject, values: dict[str, list[float]], references: dict[str, dict[str, list[float]]],
           spec: StudySpec, seeds: list[int], folder: Path, margin: float) -> dict[str, Any]:
    """What is stored for one configuration: per metric its seeds' values, spread and interval (as the sample
    allows: study/stats.py), and the paired tests with their verdicts in words."""
    images = int(values[results.VALIDATION_IMAGES][0]) if results.VALIDATION_IMAGES in values else None
    series_of = {m: v for m, v in values.items() if m != results.VALIDATION_IMAGES}
    metrics = {}
    for metric, series in series_of.items():
        spread = stats.spread(series)
        low, high = stats.interval(series, images if metric == "top1" else None)
        metrics[metric] = {"values": series, "mean": spread.mean, "std": spread.std, "low": low, "high": high,
                           "exact": len(series) > 1 and spread.std == 0}
    versus = {}
    for role, reference in references.items():
        if role in subject.roles:
            continue
        versus[role] = {}
        for metric, series in series_of.items():
            test = stats.paired(series, reference[metric])
            versus[role][metric] = {"diff": test.diff, "t": test.t, "p": test.p, "significant": test.significant,
                                    "n": test.n, "verdict": test.verdict(OBJECTIVES[metric].maximize)}
            if metric == "top1" and role == DDP:
                versus[role][metric]["seeds_needed"] = stats.seeds_to_resolve(series, reference[metric], margin)
    return {"trial": subject.trial.number, "name": subject.name, "roles": subject.roles, "seeds": seeds,
            "folder": str(folder), "metrics": metrics, "versus": versus, "validation_images": images,
            "margin": margin, "values": [metrics[m]["mean"] for m in spec.objectives], "test": stats.TEST_NAME}


def confirm(storage: Any, name: str, top: int, seeds_count: int, rule: Rule, launcher: Launcher, parallel: int,
            tracking: Tracking) -> tuple[str, list[dict[str, Any]]]:
    """Run the confirmation, store it in the study and in MLflow; returns the table (markdown) and records."""
    study_id = storage.get_study_id_from_name(name)
    spec, study_dir = stored_spec(storage, study_id), stored_study_dir(storage, study_id)
    check_writable(study_dir, "study_dir")
    study = optuna.load_study(study_name=name, storage=storage)
    chosen = subjects(study, top, rule)
    seeds = confirmation_seeds(spec, seeds_count)
    run_seeds(spec, name, study_dir, chosen, seeds, launcher, parallel)
    metrics = confirmation_metrics(spec)
    values = {s.trial.number: seed_values(s.folder(study_dir), seeds, metrics) for s in chosen}
    references = {role: values[s.trial.number] for s in chosen for role in s.roles if role in LABELS}
    records = [record(s, values[s.trial.number], references, spec, seeds, s.folder(study_dir), rule.margin)
               for s in chosen]
    table = markdown_table(name, records, metrics, seeds)
    out = study_dir / CONFIRM_DIR
    files = write_files(out, table, records, metrics)
    run_id = tracking.log_report(name, "confirmation", files, {"abtune.confirmation": "true", "optuna.study": name})
    tracking.log_metrics(run_id, {f"trial_{r['trial']}.{m}_{k}": r["metrics"][m][k] for r in records
                                  for m in metrics for k in ("mean", "std", "low", "high")
                                  if math.isfinite(r["metrics"][m][k])})
    for entry in records:
        storage.set_study_user_attr(study_id, f"{CONFIRMATION_ATTR}.trial_{entry['trial']}", entry)
    storage.set_study_user_attr(study_id, CONFIRMATION_ATTR, {
        "trials": [r["trial"] for r in records], "candidates": [s.trial.number for s in chosen if "candidate" in s.roles],
        "seeds": seeds, "rule": rule.name, "margin": rule.margin, "test": stats.TEST_NAME, "mlflow_run_id": run_id, "folder": str(out),
        "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    return table, records


# --- showing it -------------------------------------------------------------------------------------
HEADERS = ("configuration", "mean ± std", "95% interval", "vs paper defaults", "vs DDP")


def _number(metric: str, value: float, signed: bool = False) -> str:
    objective = OBJECTIVES[metric]
    if not math.isfinite(value):
        return str(value)
    return f"{value / objective.scale:{'+' if signed else ''}.{objective.digits}f}"


def _difference(metric: str, value: float) -> str:
    """A signed difference; one too small for the metric's usual digits keeps two significant ones, so a
    verdict of better or worse never stands beside `+0.00`."""
    shown = _number(metric, value, signed=True)
    if math.isfinite(value) and value != 0 and float(shown) == 0:
        return f"{value / OBJECTIVES[metric].scale:+.2g}"
    return shown


def _interval(metric: str, m: dict[str, Any]) -> str:
    if m.get("exact"):
        return "exact (same every seed)"
    if not (math.isfinite(m["low"]) and math.isfinite(m["high"])):
        return f"- ({len(m['values'])} seeds; an interval needs {stats.MIN_SEEDS})"
    shown = f"[{_number(metric, m['low'])}, {_number(metric, m['high'])}]"
    return shown + (" (validation images only)" if len(m["values"]) < stats.MIN_SEEDS else "")


def _versus(metric: str, test: dict[str, Any] | None, margin: float) -> str:
    if test is None:
        return "-"
    n = test.get("n", stats.MIN_SEEDS)
    text = f"{_difference(metric, test['diff'])}: {test.get('verdict', '')}"
    if not math.isfinite(test["t"]):  # every seed gave the same difference (traffic is deterministic)
        return text + " (same every seed)"
    if n < stats.MIN_SEEDS:
        text += f" ({n} seeds; a test needs {stats.MIN_SEEDS})"
    else:
        text += f" (t {test['t']:.2f}, p {test['p']:.3f})" + (" *" if test["significant"] else "")
    needed = test.get("seeds_needed")
    if needed is not None and test.get("verdict") == stats.CANNOT_TELL:
        text += f"; about {needed} seeds would resolve {margin:g}"
    return text


def _rows(records: list[dict[str, Any]], metric: str) -> list[list[str]]:
    rows = []
    for entry in records:
        m = entry["metrics"][metric]
        margin = entry.get("margin", 0.01)
        rows.append([entry["name"], f"{_number(metric, m['mean'])} ± {_number(metric, m['std'])}", _interval(metric, m),
                     _versus(metric, entry["versus"].get(PAPER_DEFAULTS, {}).get(metric), margin),
                     _versus(metric, entry["versus"].get(DDP, {}).get(metric), margin)])
    return rows


def _heading(name: str, records: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    images = records[0].get("validation_images") if records else None
    scored = (f"top-1 intervals: Wilson over {images} validation images a seed, widened to the seeds' t-interval "
              f"from {stats.MIN_SEEDS} seeds, within [0, 1]") if images else "top-1 intervals: the seeds' t-interval"
    return [f"Confirmation of study {name}: {plural(len(records), 'configuration')} x {plural(len(seeds), 'fresh seed')} "
            f"({', '.join(map(str, seeds))})",
            f"Test: {stats.TEST_NAME}; * = significant (p < {stats.ALPHA:.2f}, from {stats.MIN_SEEDS} seeds with a "
            f"spread); difference = row - reference; {scored}."]


def _title(metric: str) -> str:
    objective = OBJECTIVES[metric]
    unit = f" ({objective.unit})" if objective.unit else ""
    return f"{metric}{unit}, {objective.direction}"


def markdown_table(name: str, records: list[dict[str, Any]], metrics: list[str], seeds: list[int]) -> str:
    """The confirmation as markdown: the file beside the runs and the MLflow artifact."""
    lines = [*_heading(name, records, seeds), ""]
    for metric in metrics:
        lines += [f"### {_title(metric)}", "", "| " + " | ".join(HEADERS) + " |", "| --- " * len(HEADERS) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in _rows(records, metric)]
        lines.append("")
    return "\n".join(lines)


def print_confirmation(name: str, records: list[dict[str, Any]]) -> None:
    """The confirmation on the terminal, through the project's table helper."""
    from abtune import tables

    console = tables.console()
    metrics = list(records[0]["metrics"]) if records else []
    for line in _heading(name, records, records[0]["seeds"] if records else []):
        console.print(line)
    columns = [tables.Column(HEADERS[0], justify="left"), tables.Column(HEADERS[1]), tables.Column(HEADERS[2]),
               tables.Column(HEADERS[3], tables.KEY, "left", wrap=True),
               tables.Column(HEADERS[4], justify="left", wrap=True)]
    for metric in metrics:
        tables.print_table(console, _title(metric), columns, _rows(records, metric))


def write_files(out: Path, table: str, records: list[dict[str, Any]], metrics: list[str]) -> list[Path]:
    from abtune.tracking.plots import confirmation_intervals

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "confirmation.md", out / "confirmation.json", out / "confirmation.png"]
    paths[0].write_text(table)
    paths[1].write_text(json.dumps(records, indent=2) + "\n")
    rows = [{"name": r["name"], **{m: r["metrics"][m] for m in metrics}} for r in records]
    confirmation_intervals(rows, [OBJECTIVES[m] for m in metrics], paths[2])
    return paths
