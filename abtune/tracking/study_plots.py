"""An Optuna study as points on two of its objectives, and the study plots.

The plots read the study's whole trial list, as `study best` does: the reference trials are drawn
with their own markers, and the Pareto front is the search's (never the DDP reference), found on
every objective of the study: with three, the plot marks the trials on that front, drawn on two.

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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import DDP, EVALUATIONS_ATTR, REFERENCE_ATTR, TRAFFIC_EXCESS_ATTR
from abtune.objectives import OBJECTIVES, Objective, pareto_mask
from abtune.tracking import plots


def plotted_objectives(objectives: Sequence[str] | None) -> tuple[Objective, Objective]:
    """(y, x): top-1 and the study's other objective (Optuna's metric names), else inter-node bytes."""
    others = [name for name in objectives or [] if name in OBJECTIVES and name != "top1"]
    return _on_axis(OBJECTIVES["top1"]), _on_axis(OBJECTIVES[others[0] if others else "inter_node_bytes"])


def front_objectives(objectives: Sequence[str] | None) -> list[Objective]:
    """What the Pareto front is found on, as `study best` finds it: every objective of a multi-objective
    study (a third one too, though the plot draws two), else the plotted pair."""
    named = [_on_axis(OBJECTIVES[name]) for name in objectives or [] if name in OBJECTIVES]
    return named if len(named) > 1 else list(plotted_objectives(objectives))


def _on_axis(objective: Objective) -> Objective:
    """Traffic is per rank (mean over ranks): an axis says so, where a table's column header has no room."""
    return replace(objective, label=f"{objective.label} per rank") if objective.unit == "MB" else objective


def _on_front(trials: Sequence[FrozenTrial], objectives: list[Objective]) -> set[int]:
    """Numbers of the completed search trials within the traffic budget that no other beats on `objectives`."""
    candidates = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get(REFERENCE_ATTR) != DDP
                  and float(t.user_attrs.get(TRAFFIC_EXCESS_ATTR, 0.0)) <= 0.0
                  and all(t.user_attrs.get(o.name) is not None for o in objectives)]
    scores = [[o.score(float(t.user_attrs[o.name])) for o in objectives] for t in candidates]
    return {t.number for t, on_front in zip(candidates, pareto_mask(scores), strict=True) if on_front}


def _trial_point(trial: FrozenTrial, y: Objective, x: Objective) -> dict[str, Any] | None:
    attrs = trial.user_attrs
    values = [attrs.get(y.name), attrs.get(x.name)]
    if any(v is None or not math.isfinite(float(v)) for v in values):  # never reached its target: not on a plot
        return None
    return {"number": trial.number, "y": float(values[0]), "x": float(values[1]), "front": False,
            "reference": attrs.get(REFERENCE_ATTR), "y_std": attrs.get(f"{y.name}_std"),
            "x_std": attrs.get(f"{x.name}_std"), "compression": attrs.get("compression"),
            "feasible": float(attrs.get(TRAFFIC_EXCESS_ATTR, 0.0)) <= 0.0}


def study_points(trials: Sequence[FrozenTrial], objectives: Sequence[str] | None
                 ) -> tuple[Objective, Objective, list[dict[str, Any]]]:
    """The plotted objectives and every completed trial as a point, the reference trials included;
    `front` marks the search's non-dominated ones on every objective (front_objectives), as `study best`
    finds them: the DDP reference and the trials over the traffic budget are never on it."""
    y, x = plotted_objectives(objectives)
    points = [p for t in trials if t.state == TrialState.COMPLETE and (p := _trial_point(t, y, x)) is not None]
    front = _on_front(trials, front_objectives(objectives))
    for p in points:
        p["front"] = p["number"] in front
    return y, x, points


def study_curves(trials: Sequence[FrozenTrial], objectives: Sequence[str] | None
                 ) -> tuple[Objective, Objective, list[dict[str, Any]]]:
    """Every trial that reported evaluations: its steps and the plotted objectives' values there (the
    numbers the pruner ranked on), and whether it was pruned."""
    y, x = plotted_objectives(objectives)
    curves = []
    for trial in trials:
        by_step = sorted((int(s), v) for s, v in trial.user_attrs.get(EVALUATIONS_ATTR, {}).items())
        if by_step:
            curves.append({"number": trial.number, "pruned": trial.state == TrialState.PRUNED,
                           "reference": trial.user_attrs.get(REFERENCE_ATTR), "steps": [s for s, _ in by_step],
                           "y": [v.get(y.name) for _, v in by_step], "x": [v.get(x.name) for _, v in by_step]})
    return y, x, curves


def write_study_plots(trials: Sequence[FrozenTrial], objectives: Sequence[str] | None, folder: Path,
                      analysis: dict[str, Any] | None = None, recommended: int | None = None) -> dict[str, str]:
    """Write pareto_front.png, optimization_history.png, evaluations.png and, from `analysis` (the study's
    parameter importances per objective and inert parameters), importances.json and importances.png; return
    what each became. `trials`: every trial of the study, the reference trials included; `recommended`: the
    number of the trial the study recommends, marked on the front."""
    y, x, points = study_points(trials, objectives)
    for p in points:
        p["recommended"] = p["number"] == recommended
    written: dict[str, str] = {}
    if analysis is not None:
        (folder / "importances.json").write_text(json.dumps(analysis, indent=1))
        written["importances_json"] = "written"
    if not points:
        return {**written, "pareto_front": "no finished trial yet"}
    plots.pareto_front(points, y, x, folder / "pareto_front.png", front_objectives(objectives))
    plots.optimization_history(points, y, x, folder / "optimization_history.png")
    written.update(pareto_front="written", optimization_history="written")
    _, _, curves = study_curves(trials, objectives)
    if curves:
        plots.evaluation_curves(curves, y, x, folder / "evaluations.png", [p for p in points if p["reference"]])
        written["evaluations"] = "written"
    values = (analysis or {}).get("importances")
    if values:
        plots.importances(values, analysis["search_trials"], folder / "importances.png",  # type: ignore[index]
                          analysis.get("p_values"), analysis.get("significant_p", 0.05))  # type: ignore[union-attr]
        written["importances"] = "written"
    else:
        written["importances"] = f"not yet: {(analysis or {}).get('importances_missing', 'no analysis')}"
    return written
