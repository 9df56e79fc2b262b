"""The plots say what a reader needs without the code beside them: the recommended trial ringed on the front,
every line in a legend, trial names in the run plots' titles, no bar for a phase that sent nothing, end labels
apart, and top-1 axes that stop at 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from abtune.objectives import OBJECTIVES
from abtune.tracking import plots
from abtune.tracking.study_plots import study_points
from tests.quickstart_fixture import quickstart_trials
from tests.test_study_plots import SUMMARY


def test_the_recommended_trial_is_ringed_on_the_front(tmp_path: Path) -> None:
    y, x, points = study_points(quickstart_trials(), ["top1", "inter_node_bytes"])
    for p in points:
        p["recommended"] = p["number"] == 7
    drawn = plots.pareto_front(points, y, x, tmp_path / "front.png")
    (seven,) = [p for p in points if p["number"] == 7]
    assert drawn.series["recommended (trial 7)"] == [(pytest.approx(seven["x"] / 1e6), pytest.approx(seven["y"]))]
    assert "inter-node MB per rank (minimize)" in drawn.texts


def test_the_history_names_ddps_traffic_line_and_has_a_title(tmp_path: Path) -> None:
    y, x, points = study_points(quickstart_trials(), ["top1", "inter_node_bytes"])
    drawn = plots.optimization_history(points, y, x, tmp_path / "history.png")
    assert "inter-node MB per rank of DDP (right axis)" in drawn.series
    assert any(t.startswith("optimization history: top-1 (left axis)") for t in drawn.texts)


def test_a_phase_without_traffic_has_no_bar_and_the_run_is_named(tmp_path: Path) -> None:
    drawn = plots.traffic_per_phase(SUMMARY, tmp_path / "traffic.png", "trial-7")
    title = next(t for t in drawn.texts if t.startswith("trial-7: ab traffic per phase"))
    assert title.endswith("no traffic in checkpoint") and "checkpoint" not in drawn.texts


def test_spectra_and_accuracy_name_the_run(tmp_path: Path) -> None:
    drawn = plots.spectra(SUMMARY, 0.1, tmp_path / "spectra.png", "trial-3")
    assert drawn is not None and any(t.startswith("trial-3: spectra at step 60") for t in drawn.texts)
    records = [{"kind": "log", "step": s, "loss": 1.0 / s} for s in (1, 2)] + [
        {"kind": "evaluation", "step": 2, "val_top1": 0.5, "val_top5": 0.9, "val_loss": 0.7}]
    drawn = plots.accuracy_and_loss(records, [("train", 0, 2)], tmp_path / "acc.png", "trial-3")
    assert "trial-3: accuracy and loss" in drawn.texts


def test_a_confirmations_top1_axis_stops_at_one(tmp_path: Path) -> None:
    rows = [{"name": "trial 7", "top1": {"mean": 0.99, "low": 0.95, "high": 1.05, "values": [0.98, 1.0]}}]
    drawn = plots.confirmation_intervals(rows, [OBJECTIVES["top1"]], tmp_path / "confirmation.png")
    ticks = [float(t) for t in drawn.texts if t.replace(".", "", 1).isdigit()]
    assert ticks and max(ticks) <= 1.0


def test_crowded_end_labels_spread_apart_around_where_they_belong() -> None:
    placed = plots.spread([10.0, 11.0, 12.0, 50.0], gap=8.0, low=0.0, high=100.0)
    assert placed == [3.0, 11.0, 19.0, 50.0]  # the three crowded ones centred on 11, the lone one where it was
    assert plots.spread([98.0, 99.0], gap=8.0, low=0.0, high=100.0) == [92.0, 100.0]  # kept inside the axes
