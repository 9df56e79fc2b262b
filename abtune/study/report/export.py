"""`abtune study export` (every trial, as CSV or JSON) and `abtune study list` (the studies of a storage)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

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
from abtune.study import repeats, results
from abtune.study.definition import stored_spec

EXPORTED_ATTRS = (REFERENCE_ATTR, RETRY_OF_ATTR, ATTEMPT_ATTR, *results.RESULT_KEYS, TRAFFIC_EXCESS_ATTR,
                  FAIL_REASON_ATTR, RUN_DIR_ATTR)


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
    tables.print_table(tables.console(), f"studies in {url}", columns, rows)
