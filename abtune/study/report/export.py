"""`abtune study export` (every trial, as CSV or JSON, with whether it is on the Pareto front and whether it is
the study's recommendation; traffic in MB and times in s, as the column names say) and `abtune study list`
(the studies of a storage)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict
from typing import Any

import optuna
from optuna.storages import BaseStorage

from abtune import tables
from abtune.attrs import (
    ATTEMPT_ATTR,
    FAIL_REASON_ATTR,
    JOB_ATTR,
    REFERENCE_ATTR,
    RETRY_OF_ATTR,
    REUSED_SEEDS_ATTR,
    RUN_DIR_ATTR,
    SEEDS_ATTR,
    TRAFFIC_EXCESS_ATTR,
)
from abtune.errors import ConfigError
from abtune.launch.launchers import describe_job, recorded_job
from abtune.study import recommendation, repeats, results
from abtune.study.definition import stored_spec
from abtune.study.optuna_private import study_id

EXPORTED_ATTRS = (REFERENCE_ATTR, RETRY_OF_ATTR, ATTEMPT_ATTR, *results.RESULT_KEYS, TRAFFIC_EXCESS_ATTR,
                  FAIL_REASON_ATTR, RUN_DIR_ATTR)


# Columns whose unit goes into their name: (name with the unit, divisor), for the column and its spread
UNITS = {"inter_node_bytes": ("inter_node_mb", 1e6), "time_to_target": ("time_to_target_s", 1.0),
         "predicted_time_to_target": ("predicted_time_to_target_s", 1.0), "train_seconds": ("train_s", 1.0)}


def export_rows(storage: BaseStorage, name: str) -> list[dict[str, Any]]:
    """Every trial, one row each; `pareto`: on the front `study best` shows; `chosen`: the rule's pick;
    `recommended`: that pick unless it falls short of DDP (as the MLflow tag and the plots' ring)."""
    study_id = storage.get_study_id_from_name(name)
    spec = stored_spec(storage, study_id)
    trials = storage.get_all_trials(study_id, deepcopy=False)
    front = {t.number for t in recommendation.search_front(trials, spec)}
    answer = recommendation.current(optuna.load_study(study_name=name, storage=storage))
    rows = []
    for trial in trials:
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name}
        values = trial.values or [None] * len(spec.objectives)
        row.update({f"value_{m}": v for m, v in zip(spec.objectives, values, strict=True)})
        row.update({f"param_{k}": trial.params.get(k) for k in spec.space})
        row.update({key: trial.user_attrs.get(key) for key in EXPORTED_ATTRS})
        row["pareto"] = trial.number in front
        row["recommended"] = answer is not None and answer.promoted == trial.number  # never one short of DDP
        row["chosen"] = answer is not None and answer.trial == trial.number  # the rule's pick, short of DDP or not
        entry = recorded_job(trial.user_attrs)
        row[JOB_ATTR] = describe_job(entry) if entry else None  # `SLURM job 812`, as its launcher names it
        if spec.repeats > 1:
            row.update({key: trial.user_attrs.get(key) for key in repeat_columns()})
        row["datetime_start"] = trial.datetime_start.isoformat() if trial.datetime_start else None
        row["datetime_complete"] = trial.datetime_complete.isoformat() if trial.datetime_complete else None
        rows.append(with_units(row))
    return rows


def with_units(row: dict[str, Any]) -> dict[str, Any]:
    """Traffic in MB and times in s, the unit in the column's name; a target never reached is empty, not inf."""
    shown: dict[str, Any] = {}
    for key, value in row.items():
        base, _, part = key.removeprefix("value_").partition("_std")
        base = base.removesuffix("_seeds")
        if base not in UNITS:
            shown[key] = value
            continue
        unit_name, divisor = UNITS[base]
        shown[key.replace(base, unit_name, 1)] = _scaled(value, divisor)
    return shown


def _scaled(value: Any, divisor: float) -> Any:
    if isinstance(value, list):
        return [_scaled(v, divisor) for v in value]
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    return value / divisor if math.isfinite(value) else None


def repeat_columns() -> list[str]:
    """Export columns of a study with repeats: the seeds, and each result's spread and per-seed values."""
    return [SEEDS_ATTR, REUSED_SEEDS_ATTR,
            *(f"{key}_{part}" for key in repeats.SPREAD_KEYS for part in ("std", "seeds"))]


def export_text(storage: BaseStorage, name: str, fmt: str) -> str:
    rows = export_rows(storage, name)
    if fmt == "json":
        spec = stored_spec(storage, storage.get_study_id_from_name(name))
        answer = recommendation.load(optuna.load_study(study_name=name, storage=storage))
        return json.dumps({"study": name, "objectives": spec.objectives, "directions": spec.directions,
                           "definition": spec.model_dump(mode="json"),
                           "recommendation": asdict(answer) if answer else None, "trials": rows}, indent=2) + "\n"
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
        trials = storage.get_all_trials(study_id(study), deepcopy=False)
        best = results.best_trial(trials)
        try:
            spec = stored_spec(storage, study_id(study))
            objectives, budget = ", ".join(spec.objectives), f"{spec.trials}"
        except ConfigError:  # a study made by plain Optuna: listed, but it has no abtune definition
            objectives, budget = "(not an abtune study)", "-"
        first = min((t.datetime_start for t in trials if t.datetime_start), default=None)
        rows.append([study.study_name, objectives, budget, str(results.finished_count(trials)),
                     f"{best.user_attrs['top1']:.4f}" if best else "-", f"{first:%Y-%m-%d %H:%M}" if first else "-"])
    tables.print_table(tables.console(), f"studies in {url}", columns, rows)
