"""The PNGs a researcher reads, checked on what the figures draw (plots.Drawn, read back from each figure):
the study plots show the reference trials beside the search, no legend covers data, and every label says
what it shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import FrozenTrial, create_trial
from PIL import Image

from abtune.objectives import OBJECTIVES
from abtune.study import importance, results
from abtune.study.definition import open_search_study
from abtune.study.runner import StudyRunner
from abtune.study.storage import open_storage
from abtune.tracking import open_tracking, plots
from abtune.tracking.study_plots import front_objectives, study_curves, study_points
from tests.quickstart_fixture import DDP_TRIAL, PAPER_TRIAL, quickstart_study, quickstart_trials

TOP1, BYTES = OBJECTIVES["top1"], OBJECTIVES["inter_node_bytes"]
DDP_RED = np.array([214, 39, 40])  # matplotlib's tab:red, the DDP reference's star


def _ddp_pixels(png: Path) -> int:
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    return int((np.abs(pixels - DDP_RED).sum(axis=1) < 30).sum())


def test_the_study_run_draws_the_ddp_reference_on_its_pareto_plot(tmp_path: Path, mlflow_db: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What the runner hands the plots: every trial (the search study hides the finished DDP trial from its
    sampler), so the parent run's Pareto plot has the DDP star, drawn in tab:red and nowhere else."""
    url = quickstart_study(tmp_path)
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    runner = StudyRunner(open_storage(url), "quickstart", url, 1, None, tracking=open_tracking(uri))
    runner._update_study_artifacts(final=True)
    folder = Path(MlflowClient(uri).download_artifacts(runner.parent_run, "study", str(tmp_path / "artifacts")))
    assert _ddp_pixels(folder / "pareto_front.png") > 100


def test_the_pareto_plot_marks_both_references_and_draws_the_front_study_best_prints(tmp_path: Path) -> None:
    trials = quickstart_trials()
    y, x, points = study_points(trials, ["top1", "inter_node_bytes"])
    drawn = plots.pareto_front(points, y, x, tmp_path / "pareto_front.png")
    ddp, paper = trials[DDP_TRIAL].user_attrs, trials[PAPER_TRIAL].user_attrs
    assert drawn.series[f"DDP reference (trial {DDP_TRIAL})"] == [(ddp["inter_node_bytes"] / 1e6, ddp["top1"])]
    assert drawn.series[f"paper defaults (trial {PAPER_TRIAL})"] == [(paper["inter_node_bytes"] / 1e6, paper["top1"])]
    front = results.pareto_front(results.search_trials(trials), ["top1", "inter_node_bytes"])  # as study best
    expected = sorted((t.user_attrs["inter_node_bytes"] / 1e6, t.user_attrs["top1"]) for t in front)
    assert [t.number for t in front] == [4, 7, 2] and drawn.series["Pareto front"] == expected
    assert drawn.covered == 0
    assert "inter-node MB per rank as a multiple of DDP's" in drawn.texts  # the close-up's top axis


THREE = ["top1", "inter_node_bytes", "train_seconds"]


def _three_objective_trials() -> list[FrozenTrial]:
    """Trial 2 trails trial 1 on top-1 and traffic but trains fastest: on the front of all three objectives,
    off the front of the two the plot draws. Trial 3 is beaten by trial 0 on all three."""
    study = optuna.create_study(directions=[OBJECTIVES[m].direction for m in THREE])
    study.set_metric_names(THREE)
    rows = [(0.95, 50e6, 100.0, None), (0.94, 40e6, 100.0, None), (0.93, 45e6, 50.0, None), (0.92, 60e6, 120.0, None),
            (0.95, 140e6, 90.0, "ddp")]
    for top1, traffic, seconds, reference in rows:
        attrs = {"top1": top1, "inter_node_bytes": traffic, "train_seconds": seconds, "compression": 2.0,
                 **({"reference": reference} if reference else {})}
        study.add_trial(create_trial(values=[attrs[m] for m in THREE], user_attrs=attrs))
    return study.trials


def test_with_three_objectives_the_pareto_plot_marks_the_front_study_best_finds_on_all_three(tmp_path: Path) -> None:
    trials = _three_objective_trials()
    front = results.pareto_front(results.search_trials(trials), THREE)  # as study best finds it
    assert sorted(t.number for t in front) == [0, 1, 2]
    y, x, points = study_points(trials, THREE)
    assert (y.name, x.name) == ("top1", "inter_node_bytes")
    assert sorted(p["number"] for p in points if p["front"]) == [0, 1, 2]
    drawn = plots.pareto_front(points, y, x, tmp_path / "pareto_front.png", front_objectives(THREE))
    label = "Pareto front on top-1, inter-node MB per rank, train s"
    assert sorted(drawn.series[label]) == sorted((t.user_attrs["inter_node_bytes"] / 1e6, t.user_attrs["top1"])
                                                 for t in front)
    assert "Pareto front" not in drawn.series  # no staircase through the shadows of a 3-objective front
    assert any(t.endswith("on all 3 objectives, drawn on top-1 and inter-node MB per rank") for t in drawn.texts), drawn.texts
    assert drawn.covered == 0


def test_the_history_and_the_evaluation_curves_show_the_ddp_reference_and_label_their_lines(tmp_path: Path) -> None:
    trials = quickstart_trials()
    y, x, points = study_points(trials, ["top1", "inter_node_bytes"])
    history = plots.optimization_history(points, y, x, tmp_path / "history.png")
    assert history.series["inter-node MB per rank, DDP reference"] == [(DDP_TRIAL, 140.409068)]
    assert DDP_TRIAL not in [n for n, _ in history.series["top-1"]]  # not a search trial
    assert history.covered == 0
    _, _, curves = study_curves(trials, ["top1", "inter_node_bytes"])
    evaluations = plots.evaluation_curves(curves, y, x, tmp_path / "evaluations.png", points)
    assert evaluations.covered == 0
    assert {"search trial", "paper defaults"} <= set(evaluations.texts)
    assert any(t.startswith(f"DDP reference, final (trial {DDP_TRIAL}):\ntop-1 0.9500, inter-node MB per rank 140.41")
               for t in evaluations.texts), evaluations.texts
    assert {str(t.number) for t in trials if t.number != DDP_TRIAL} <= set(evaluations.texts)  # line ends


def test_importances_say_how_many_trials_they_rest_on_and_warn_when_few(tmp_path: Path) -> None:
    trials = quickstart_trials()
    space = list(trials[0].params)
    report = importance.analysis(trials, space, ["top1", "inter_node_bytes"])
    assert report["search_trials"] == 7  # DDP is not a search trial
    few = plots.importances(report["importances"], report["search_trials"], tmp_path / "few.png")
    assert any(t.startswith("computed over 7 completed search trials\nwarning: fewer than 20") for t in few.texts)
    many = plots.importances(report["importances"], 40, tmp_path / "many.png")
    assert "computed over 40 completed search trials" in many.texts


SUMMARY = {  # what plots read from a summary.json: an AB run on 2 nodes (phases in the file's alphabetical order)
    "method": "ab",
    "traffic": {"by_phase": {p: {"total": {"mean": total}, "inter": {"mean": inter}} for p, total, inter in (
        ("ab", 23.9e6, 0.0), ("checkpoint", 0.0, 0.0), ("eval", 0.7e6, 0.3e6), ("rebound", 50.5e6, 25.3e6),
        ("setup", 0.5e6, 0.3e6), ("sync", 6.3e6, 3.2e6), ("warmup", 56.2e6, 28.1e6))},
        "training_inter_node_bytes": 56.6e6, "ddp_reference_inter_node_bytes": 140.4e6, "ddp_reference_bytes": 280.8e6},
    "spectra": {f"encoder.layers.encoder_layer_{i}.{w}": [1.0, 0.5, 0.05, 0.001]
                for i in range(2) for w in ("self_attention.out_proj.weight", "mlp.0.weight")},
    "decompositions": [{"step": 60, "ranks": {f"encoder.layers.encoder_layer_{i}.mlp.0.weight": 2 for i in range(2)}}],
}


def test_traffic_per_phase_runs_in_phase_order_and_its_ddp_line_is_the_inter_node_reference(tmp_path: Path) -> None:
    drawn = plots.traffic_per_phase(SUMMARY, tmp_path / "traffic.png")
    order = ["warmup", "ab", "sync", "rebound"]  # checkpoint sent nothing, setup and eval under 1%: no bar
    ticks = [t for t in drawn.texts if t in order]
    assert ticks == order
    ddp_line = drawn.series["DDP training inter-node (140.4 MB)"]
    assert [y for _, y in ddp_line] == [pytest.approx(140.4)] * 2  # not DDP's all-bytes 280.8
    assert "training inter-node 56.6 MB = 0.40x DDP's" in "\n".join(drawn.texts)
    assert drawn.covered == 0


def test_spectra_name_each_layer_with_its_block_index(tmp_path: Path) -> None:
    drawn = plots.spectra(SUMMARY, 0.1, tmp_path / "spectra.png")
    assert drawn is not None and drawn.covered == 0
    assert {"encoder_layer_0.self_attention.out_proj", "encoder_layer_1.self_attention.out_proj",
            "encoder_layer_0.mlp.0", "encoder_layer_1.mlp.0"} <= set(drawn.texts)
    assert plots.short_layer_names(["blocks.0.attn.qkv.weight", "blocks.11.mlp.fc1.weight", "head.weight"]) == [
        "blocks.0.attn.qkv", "blocks.11.mlp.fc1", "head"]


def test_the_run_curves_keep_their_legends_clear_of_the_data(tmp_path: Path) -> None:
    records = [{"kind": "log", "step": s, "loss": 2.0 / s} for s in range(10, 310, 10)] + [
        {"kind": "evaluation", "step": s, "val_top1": 0.9 + s / 10000, "val_top5": 0.99, "val_loss": 0.3}
        for s in (100, 200, 300)]
    drawn = plots.accuracy_and_loss(records, [("warmup", 0, 60), ("ab", 60, 70), ("rebound", 70, 73)],
                                    tmp_path / "accuracy.png")
    assert drawn.covered == 0 and drawn.series["val top-1"][-1] == (300, pytest.approx(0.93))


def test_the_plots_of_a_stored_study_read_every_trial(tmp_path: Path) -> None:
    """open_search_study is what the runner holds: its trial list for the sampler lacks the DDP trial, its
    all_trials does not."""
    url = quickstart_study(tmp_path)
    study, _ = open_search_study(open_storage(url), "quickstart")
    assert DDP_TRIAL not in [t.number for t in study.get_trials()]
    _, _, points = study_points(study.all_trials(), study.metric_names)
    assert [p["number"] for p in points if p["reference"] == "ddp"] == [DDP_TRIAL]
