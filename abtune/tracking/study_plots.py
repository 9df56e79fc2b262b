"""An Optuna study as points on two of its objectives, and the study plots.

The axes: top-1 (every study optimizes it) against the study's other objective, named in Optuna's
`metric_names`; a study of top-1 alone, or one created before abtune named its objectives, plots
inter-node bytes (every trial records every objective, abtune/objectives.py). Each point's values are
read from the trial's attributes, so a single-objective study's plots look like a multi-objective
one's. Reference trials carry the user attr `reference` (`ddp` or `paper-defaults`). Trials of a
study with seed repeats carry NAME_std: the Pareto plot draws them as error bars.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from abtune.objectives import EVALUATIONS_ATTR, OBJECTIVES, Objective, pareto_mask
from abtune.tracking import plots

REFERENCE_ATTR = "reference"


def plotted_objectives(study: optuna.Study) -> tuple[Objective, Objective]:
    """(y, x): top-1 and the study's other objective, else inter-node bytes."""
    others = [name for name in study.metric_names or [] if name in OBJECTIVES and name != "top1"]
    return OBJECTIVES["top1"], OBJECTIVES[others[0] if others else "inter_node_bytes"]


def _trial_point(trial: FrozenTrial, y: Objective, x: Objective) -> dict[str, Any] | None:
    attrs = trial.user_attrs
    values = [attrs.get(y.name), attrs.get(x.name)]
    if any(v is None or not math.isfinite(float(v)) for v in values):  # never reached its target: not on a plot
        return None
    return {"number": trial.number, "y": float(values[0]), "x": float(values[1]), "front": False,
            "reference": attrs.get(REFERENCE_ATTR), "y_std": attrs.get(f"{y.name}_std"),
            "x_std": attrs.get(f"{x.name}_std"), "compression": attrs.get("compression")}


def study_points(study: optuna.Study) -> tuple[Objective, Objective, list[dict[str, Any]]]:
    """The plotted objectives and every finished trial as a point; `front` marks the non-dominated ones."""
    y, x = plotted_objectives(study)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    points = [p for t in trials if (p := _trial_point(t, y, x)) is not None]
    signs = [1.0 if objective.maximize else -1.0 for objective in (y, x)]
    front = pareto_mask([[signs[0] * p["y"], signs[1] * p["x"]] for p in points])
    for p, on_front in zip(points, front, strict=True):
        p["front"] = on_front
    return y, x, points


def study_curves(study: optuna.Study) -> tuple[Objective, Objective, list[dict[str, Any]]]:
    """Every trial that reported evaluations: its steps and the plotted objectives' values there (the
    numbers the pruner ranked on), and whether it was pruned."""
    y, x = plotted_objectives(study)
    curves = []
    for trial in study.get_trials(deepcopy=False):
        by_step = sorted((int(s), v) for s, v in trial.user_attrs.get(EVALUATIONS_ATTR, {}).items())
        if by_step:
            curves.append({"number": trial.number, "pruned": trial.state == TrialState.PRUNED,
                           "reference": trial.user_attrs.get(REFERENCE_ATTR), "steps": [s for s, _ in by_step],
                           "y": [v.get(y.name) for _, v in by_step], "x": [v.get(x.name) for _, v in by_step]})
    return y, x, curves


def write_study_plots(study: optuna.Study, folder: Path, analysis: dict[str, Any] | None = None) -> dict[str, str]:
    """Write pareto_front.png, optimization_history.png and, from `analysis` (the study's parameter
    importances per objective and inert parameters), importances.json and importances.png; return what each became."""
    y, x, points = study_points(study)
    written: dict[str, str] = {}
    if analysis is not None:
        (folder / "importances.json").write_text(json.dumps(analysis, indent=1))
        written["importances_json"] = "written"
    if not points:
        return {**written, "pareto_front": "no finished trial yet"}
    plots.pareto_front(points, y, x, folder / "pareto_front.png")
    plots.optimization_history(points, y, x, folder / "optimization_history.png")
    written.update(pareto_front="written", optimization_history="written")
    _, _, curves = study_curves(study)
    if curves:
        plots.evaluation_curves(curves, y, x, folder / "evaluations.png")
        written["evaluations"] = "written"
    values = (analysis or {}).get("importances")
    if values:
        plots.importances(values, folder / "importances.png")
        written["importances"] = "written"
    else:
        written["importances"] = f"not yet: {(analysis or {}).get('importances_missing', 'no analysis')}"
    return written
