"""The plots spend their canvas on what can be seen: no bar too small to see in the traffic plot (the title
names those phases), whole trial numbers on the history's axis, and DDP's traffic line below the top of the
history, where the best top-1 line runs."""

from __future__ import annotations

import copy
from pathlib import Path

from abtune.tracking import plots
from abtune.tracking.study_plots import study_points
from tests.quickstart_fixture import quickstart_trials
from tests.test_study_plots import SUMMARY


def test_a_phase_too_small_to_see_has_no_bar_and_is_named(tmp_path: Path) -> None:
    summary = copy.deepcopy(SUMMARY)
    for phase, nbytes in (("eval", 12_000.0), ("control", 1_200.0), ("report", 40.0), ("checkpoint", 0.0)):  # kilobytes, as the quickstart's
        summary["traffic"]["by_phase"][phase] = {"total": {"mean": nbytes}, "inter": {"mean": nbytes / 2}}
    drawn = plots.traffic_per_phase(summary, tmp_path / "traffic.png", "trial-7")
    title = next(t for t in drawn.texts if t.startswith("trial-7: ab traffic per phase"))
    # under 1% of the plot's height (DDP's 140.4 MB): setup's 0.5 MB and eval's 12 kB
    assert "too small to draw: setup 0.50 MB, eval 0.01 MB, control 1.2 kB, report 40 B" in title and title.endswith("no traffic in checkpoint"), title
    assert "eval" not in drawn.texts and "setup" not in drawn.texts and "sync" in drawn.texts  # sync: 6.3 MB


def test_the_history_counts_whole_trials_and_keeps_ddps_line_off_the_top(tmp_path: Path) -> None:
    y, x, points = study_points(quickstart_trials(), ["top1", "inter_node_bytes"])
    drawn = plots.optimization_history(points, y, x, tmp_path / "history.png")
    ticks = [t for t in drawn.texts if t.lstrip("−-").replace(".", "", 1).isdigit()]
    assert "0.25" not in ticks and "0.5" not in ticks  # no fractions of a trial
    ((_, ddp_mb), _) = drawn.series["inter-node MB per rank of DDP (right axis)"]
    assert ddp_mb == max(p["x"] for p in points) / 1e6
    top = max(float(t.replace("−", "-")) for t in ticks)  # the right axis reaches past DDP's 140 MB
    assert top >= 1.2 * ddp_mb, ticks


def test_importances_say_the_section_once_and_traffic_per_rank(tmp_path: Path) -> None:
    values = {"top1": {"method.warmup_frac": 0.7, "method.ab_frac": 0.3},
              "inter_node_bytes": {"method.warmup_frac": 0.4, "method.ab_frac": 0.6}}
    drawn = plots.importances(values, 30, tmp_path / "importances.png")
    assert "importance for inter-node MB per rank (method.*)" in drawn.texts, drawn.texts
    assert "warmup_frac" in drawn.texts and "method.warmup_frac" not in drawn.texts


def test_a_layer_kept_dense_draws_a_full_bar_not_an_empty_one(tmp_path: Path) -> None:
    summary = copy.deepcopy(SUMMARY)
    last = summary["decompositions"][-1]
    dense = next(layer for layer in summary["spectra"] if layer not in last["ranks"]) if any(
        layer not in last["ranks"] for layer in summary["spectra"]) else last["ranks"].popitem()[0]
    last["kept_full_rank"] = [dense]
    drawn = plots.spectra(summary, 0.1, tmp_path / "spectra.png", "trial-6")
    assert drawn is not None and "kept dense (full rank)" in drawn.texts
    drawn = plots.spectra(SUMMARY, 0.1, tmp_path / "factored.png", "trial-6")
    assert drawn is not None and "kept dense (full rank)" not in drawn.texts  # every layer factored: no such key
