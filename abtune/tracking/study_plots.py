"""An Optuna study as points (top-1, inter-node bytes) and the three study plots.

Which objective is which: a study with `metric_names` names them (a name with "top1", a name with
"byte"); otherwise the first maximized value is top-1 and the first minimized one inter-node bytes.
A single-objective study maximizes top-1 and keeps the bytes in the user attr `inter_node_bytes`.
Reference trials carry the user attr `reference` (`ddp` or `paper-defaults`). Trials of a study with
seed repeats carry `top1_std` and `inter_node_bytes_std`: the Pareto plot draws them as error bars.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from abtune.tracking import plots

BYTES_ATTR = "inter_node_bytes"
REFERENCE_ATTR = "reference"


def objective_indices(study: optuna.Study) -> tuple[int | None, int | None]:
    """Indices of (top-1, inter-node bytes) in a trial's values; None: not among the values."""
    names = study.metric_names or []
    top1 = next((i for i, n in enumerate(names) if "top1" in n.lower()), None)
    nbytes = next((i for i, n in enumerate(names) if "byte" in n.lower()), None)
    directions = study.directions
    if top1 is None:
        top1 = next((i for i, d in enumerate(directions) if d == StudyDirection.MAXIMIZE), None)
    if nbytes is None:
        nbytes = next((i for i, d in enumerate(directions) if d == StudyDirection.MINIMIZE), None)
    return top1, nbytes


def _trial_point(trial: FrozenTrial, top1: int | None, nbytes: int | None) -> dict[str, Any] | None:
    values = trial.values or []
    accuracy = values[top1] if top1 is not None else trial.user_attrs.get("top1")
    traffic = values[nbytes] if nbytes is not None else trial.user_attrs.get(BYTES_ATTR)
    if accuracy is None or traffic is None:
        return None
    return {"number": trial.number, "top1": float(accuracy), "bytes": float(traffic), "front": False,
            "reference": trial.user_attrs.get(REFERENCE_ATTR),
            "top1_std": trial.user_attrs.get("top1_std"), "bytes_std": trial.user_attrs.get(f"{BYTES_ATTR}_std"),
            "compression": trial.user_attrs.get("compression")}


def study_points(study: optuna.Study) -> list[dict[str, Any]]:
    """Every finished trial as a point; `front` marks the non-dominated ones (max top-1, min bytes)."""
    top1, nbytes = objective_indices(study)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    points = [p for t in trials if (p := _trial_point(t, top1, nbytes)) is not None]
    for p in points:
        p["front"] = not any(_dominates(q, p) for q in points)
    return points


def _dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["top1"] >= b["top1"] and a["bytes"] <= b["bytes"] and (a["top1"] > b["top1"] or a["bytes"] < b["bytes"])


def write_study_plots(study: optuna.Study, folder: Path, analysis: dict[str, Any] | None = None) -> dict[str, str]:
    """Write pareto_front.png, optimization_history.png and, from `analysis` (the study's parameter
    importances per objective and inert parameters), importances.json and importances.png; return what each became."""
    points = study_points(study)
    written: dict[str, str] = {}
    if analysis is not None:
        (folder / "importances.json").write_text(json.dumps(analysis, indent=1))
        written["importances_json"] = "written"
    if not points:
        return {**written, "pareto_front": "no finished trial yet"}
    plots.pareto_front(points, folder / "pareto_front.png")
    plots.optimization_history(points, folder / "optimization_history.png")
    written.update(pareto_front="written", optimization_history="written")
    values = (analysis or {}).get("importances")
    if values:
        plots.importances(values, folder / "importances.png")
        written["importances"] = "written"
    else:
        written["importances"] = f"not yet: {(analysis or {}).get('importances_missing', 'no analysis')}"
    return written
