"""Each PNG is drawn once: laid out, rendered and written cropped to what it shows (a 0.1-inch white margin, as
savefig(bbox_inches="tight") leaves, which renders a figure twice more); a figure drawn past its canvas is
widened to fit. Every trial's MLflow run writes three such PNGs, so each draw is seconds of a study."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from abtune.tracking import plots
from abtune.tracking.study_plots import study_curves, study_points
from tests.quickstart_fixture import quickstart_trials
from tests.test_study_plots import SUMMARY

RECORDS = [{"kind": "log", "step": s, "loss": 2.0 / s} for s in range(10, 310, 10)] + [
    {"kind": "evaluation", "step": s, "val_top1": 0.9 + s / 10000, "val_top5": 0.99, "val_loss": 0.3}
    for s in (100, 200, 300)]


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """The figures drawn meanwhile, once per draw."""
    drawn: list[Figure] = []
    draw = Figure.draw

    def counted(figure: Figure, renderer: object) -> None:
        drawn.append(figure)
        draw(figure, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    yield drawn


def _ink(png: Path) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """The PNG's size and how far its drawing lies from each edge (left, top, right, bottom), in pixels."""
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    rows, columns = np.nonzero((pixels != 255).any(axis=2))
    height, width = pixels.shape[:2]
    return (width, height), (columns.min(), rows.min(), width - 1 - columns.max(), height - 1 - rows.max())


def test_a_runs_plots_are_each_drawn_once_and_cropped_to_what_they_show(tmp_path: Path, draws: list[Figure]) -> None:
    written = [plots.accuracy_and_loss(RECORDS, [("warmup", 0, 60), ("ab", 60, 300)], tmp_path / "accuracy.png", "trial-3"),
               plots.traffic_per_phase(SUMMARY, tmp_path / "traffic.png", "trial-3"),
               plots.spectra(SUMMARY, 0.1, tmp_path / "spectra.png", "trial-3")]
    assert len(draws) == len(set(draws)) == 3
    margin = round(plots.MARGIN_INCHES * plots.DPI)
    for drawn, figure in zip(written, draws, strict=True):
        assert drawn is not None and drawn.covered == 0
        (width, height), edges = _ink(drawn.path)
        assert edges == (margin,) * 4, (drawn.path.name, edges)
        canvas = figure.get_size_inches() * plots.DPI
        assert width < canvas[0] and height < canvas[1]  # the white the layout left is cut off


def test_the_evaluation_curves_place_their_end_labels_without_drawing_first(tmp_path: Path, draws: list[Figure]) -> None:
    trials = quickstart_trials()
    y, x, _ = study_points(trials, ["top1", "inter_node_bytes"])
    _, _, curves = study_curves(trials, ["top1", "inter_node_bytes"])
    drawn = plots.evaluation_curves(curves, y, x, tmp_path / "evaluations.png")  # no DDP line: nothing else reads the limits
    assert len(draws) == 1
    for axis in draws[0].axes:  # each label beside its line's end: moved at most a few gaps (8 pt) to keep labels apart
        offsets = [label.xyann[1] + 3 for label in axis.texts]
        assert len(offsets) == len(curves) and max(map(abs, offsets)) <= 8 * len(offsets) / 2, offsets
    assert drawn.covered == 0 and set(drawn.texts) >= {str(c["number"]) for c in curves}


def test_a_figure_drawn_past_its_canvas_is_widened_to_show_it(tmp_path: Path) -> None:
    figure, axis = plt.subplots(figsize=(4, 3))
    axis.plot([0, 1], [0, 1])
    figure.text(0.98, 0.5, "a note reaching past the right edge")  # outside any axes: no layout makes room for it
    drawn = plots._save(figure, tmp_path / "wide.png")
    (width, _), (_, _, right, _) = _ink(drawn.path)
    assert width > 4 * plots.DPI and right >= round(plots.MARGIN_INCHES * plots.DPI) - 1
