"""optuna-dashboard's study page shows the Pareto front in MB beside its own (which plots the stored objective,
bytes): the figure abtune stores with the recommendation draws traffic in MB per rank, labels the references
and rings the recommended trial, and the trials' objective values stay in bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from abtune.study import dashboard_front, recommendation
from tests.quickstart_fixture import DDP_TRIAL, quickstart_trials
from tests.test_recommendation_record import quickstart_with_ddp_at


class _Off:
    def show_recommendation(self, *args: Any, **kwargs: Any) -> None:
        pass


def _stored_figure(study: optuna.Study) -> dict[str, Any]:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    objects = get_plotly_graph_objects(study._storage.get_study_system_attrs(study._study_id))
    return json.loads(objects[dashboard_front.FIGURE_ID])


def test_the_dashboard_front_is_in_mb_with_the_references_and_the_choice_marked(tmp_path: Path) -> None:
    url = quickstart_with_ddp_at(tmp_path, 0.95)
    study = optuna.load_study(study_name="quickstart", storage=url)
    recommendation.publish(study, recommendation.current(study), _Off(), None)

    figure = _stored_figure(study)
    traces = {trace["name"]: trace for trace in figure["data"]}
    assert set(traces) == {"trials", "Pareto front", "DDP reference (trial 1)", "paper defaults (trial 0)",
                           "recommended: trial 2"}
    assert (traces["recommended: trial 2"]["x"], traces["recommended: trial 2"]["y"]) == ([46.88], [0.9472222222222222])
    assert traces["DDP reference (trial 1)"]["x"] == [140.41]
    front = traces["Pareto front"]
    assert front["customdata"] == [2, 7, 4] and front["x"] == [46.88, 47.14, 59.98]  # least traffic first
    assert figure["layout"]["xaxis"]["title"]["text"] == "inter-node MB per rank (training)"
    stored = {t.number: t.values for t in study.trials}
    assert stored[DDP_TRIAL] == quickstart_trials()[DDP_TRIAL].values  # the objectives stay in bytes


def test_a_study_short_of_ddp_rings_no_trial(tmp_path: Path) -> None:
    url = quickstart_with_ddp_at(tmp_path, 0.99)
    study = optuna.load_study(study_name="quickstart", storage=url)
    recommendation.publish(study, recommendation.current(study), _Off(), None)
    names = [trace["name"] for trace in _stored_figure(study)["data"]]
    assert not [name for name in names if name.startswith("recommended")], names
