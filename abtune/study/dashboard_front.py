"""The study's Pareto front in MB on optuna-dashboard's study page, beside the dashboard's own.

optuna-dashboard draws its Pareto front from the trials' objective values as stored: the traffic in bytes
(40,000,000-140,000,000 on its axis), and it has no setting for an axis' unit or scale. Optuna's metric names
only rename an axis, and storing the objective in MB would change what every trial, sampler and export of
the study means. So the study carries a second figure, which the dashboard shows on its study page under the
built-in plots (a plotly figure stored with optuna_dashboard.save_plotly_graph_object): top-1 against
inter-node MB per rank, the front joined, the DDP and paper-defaults references labelled and the recommended
trial ringed. It is rewritten with the study's recommendation (recommendation.publish).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from abtune.attrs import DDP, PAPER_DEFAULTS
from abtune.study import results

FIGURE_ID = "abtune-pareto-front-mb"  # one figure per study, replaced on each update
MEGA = 1e6
AXES = ("top1", "inter_node_bytes")
REFERENCE_MARKS = {DDP: ("DDP reference", "star", "#d62728"), PAPER_DEFAULTS: ("paper defaults", "diamond", "#ff7f0e")}


class _Figure:
    """What save_plotly_graph_object reads of a plotly figure (its JSON), without needing plotly here."""

    def __init__(self, figure: dict[str, Any]) -> None:
        self.figure = figure

    def to_json(self) -> str:
        return json.dumps(self.figure)


def save(study: optuna.Study, trials: Sequence[FrozenTrial], recommended: int | None) -> None:
    """Store the figure on the study (nothing before a trial with top-1 and traffic has finished)."""
    figure = front_figure(trials, recommended)
    if figure is None:
        return
    from optuna_dashboard import save_plotly_graph_object

    save_plotly_graph_object(study, _Figure(figure), graph_object_id=FIGURE_ID)


def front_figure(trials: Sequence[FrozenTrial], recommended: int | None) -> dict[str, Any] | None:
    """The plotly figure (data and layout, as JSON-ready dicts); None when no trial has both figures."""
    searched = [t for t in results.search_trials(trials) if all(a in t.user_attrs for a in AXES)]
    if not searched:
        return None
    front = sorted(results.pareto_front([t for t in searched if results.feasible(t)], AXES),
                   key=lambda t: t.user_attrs["inter_node_bytes"])
    data = [_points("trials", searched, {"color": "#9ecae1", "size": 8}),
            {**_points("Pareto front", front, {"color": "#1f77b4", "size": 9}), "mode": "lines+markers",
             "line": {"shape": "hv", "color": "#1f77b4"}}]
    for kind, (name, symbol, color) in REFERENCE_MARKS.items():
        reference = results.reference(trials, kind)
        if reference is not None and all(a in reference.user_attrs for a in AXES):
            data.append({**_points(f"{name} (trial {reference.number})", [reference],
                                   {"symbol": symbol, "size": 15, "color": color}),
                         "mode": "markers+text", "text": [name], "textposition": "top center"})
    chosen = [t for t in searched if t.number == recommended]
    if chosen:
        data.append({**_points(f"recommended: trial {recommended}", chosen,
                               {"symbol": "circle-open", "size": 22, "color": "black", "line": {"width": 2}})})
    return {"data": data, "layout": {
        "title": {"text": "Pareto front: top-1 vs inter-node MB per rank"},
        "xaxis": {"title": {"text": "inter-node MB per rank (training)"}},
        "yaxis": {"title": {"text": "top-1"}},
        "legend": {"orientation": "h", "y": -0.25}, "margin": {"t": 50}}}


def _points(name: str, trials: Sequence[FrozenTrial], marker: dict[str, Any]) -> dict[str, Any]:
    return {"type": "scatter", "mode": "markers", "name": name, "marker": marker,
            "x": [round(t.user_attrs["inter_node_bytes"] / MEGA, 2) for t in trials],
            "y": [t.user_attrs["top1"] for t in trials],
            "customdata": [t.number for t in trials],
            "hovertemplate": "trial %{customdata}<br>top-1 %{y:.4f}<br>%{x:.2f} MB<extra></extra>"}
