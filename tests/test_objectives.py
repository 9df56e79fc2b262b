"""Objectives as one definition each (abtune/objectives.py): the study file, the trial's values, the
tables and the plots all take them from there."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from abtune.errors import ConfigError
from abtune.objectives import OBJECTIVES
from abtune.runfiles import read_summary
from abtune.study.report import trial_table
from abtune.study.spec import load_study_spec
from abtune.timing import load_cluster, predict
from abtune.tracking.study_plots import study_points, write_study_plots
from tests.conftest import run_cli
from tests.study_helpers import TINY_BASE, trials_of, write_study

SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3)}


def test_the_study_file_accepts_exactly_the_defined_objectives(tmp_path: Path) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", objectives=["top1", "train_seconds"],
                                       pruner={"name": "none"}))
    assert spec.directions == ["maximize", "minimize"]
    with pytest.raises(ConfigError, match="objectives.1: Input should be 'top1', 'inter_node_bytes', 'compression', "
                                          "'train_seconds', 'time_to_target' or 'predicted_time_to_target'"):
        load_study_spec(write_study(tmp_path / "bad.yaml", objectives=["top1", "accuracy"], pruner={"name": "none"}))
    one_node = write_study(tmp_path / "n.yaml", objectives=["top1", "inter_node_bytes"], pruner={"name": "none"},
                           layout={"nproc": 2, "ranks_per_node": 2})
    with pytest.raises(ConfigError, match="inter-node traffic needs more than one node"):
        load_study_spec(one_node)


def test_predicted_time_to_target_needs_a_target_and_a_cluster_the_layout_fits(tmp_path: Path) -> None:
    targeted = {**TINY_BASE, "train": {**TINY_BASE["train"], "target_top1": 0.5}}
    objectives = ["top1", "predicted_time_to_target"]
    with pytest.raises(ConfigError, match=r"needs train.cluster in the base config \(or `cluster: NAME`"):
        load_study_spec(write_study(tmp_path / "a.yaml", base=targeted, objectives=objectives, pruner={"name": "none"}))
    with pytest.raises(ConfigError, match="needs train.target_top1"):
        load_study_spec(write_study(tmp_path / "b.yaml", base=TINY_BASE, objectives=objectives, pruner={"name": "none"},
                                    cluster="paper-a100-hdr200"))
    with pytest.raises(ConfigError, match=r"c.yaml: cluster: cluster nowhere: no such description"):
        load_study_spec(write_study(tmp_path / "c.yaml", base=targeted, objectives=objectives, pruner={"name": "none"},
                                    cluster="nowhere"))
    with pytest.raises(ConfigError, match=r"cluster: the run's 1 node\(s\) x 8 rank\(s\) do not fit cluster "
                                          r"paper-a100-hdr200 \(32 x 4\)"):
        load_study_spec(write_study(tmp_path / "d.yaml", base=targeted, objectives=objectives, pruner={"name": "none"},
                                    cluster="paper-a100-hdr200", layout={"nproc": 8}))
    spec = load_study_spec(write_study(tmp_path / "e.yaml", base=targeted, objectives=objectives,
                                       pruner={"name": "none"}, cluster="paper-a100-hdr200"))
    assert spec.base["train"]["cluster"] == "paper-a100-hdr200" and spec.directions == ["maximize", "minimize"]


def _study(objectives: list[str]) -> optuna.Study:
    study = optuna.create_study(directions=[OBJECTIVES[m].direction for m in objectives])
    study.set_metric_names(objectives)
    for number, (top1, seconds) in enumerate([(0.90, 30.0), (0.95, 50.0), (0.85, 60.0), (0.80, 20.0)]):
        attrs = {"top1": top1, "train_seconds": seconds, "inter_node_bytes": 5e6, "compression": 1.0}
        study.add_trial(create_trial(params={"method.warmup_frac": 0.1 + 0.05 * number}, distributions=SPACE,
                                     values=[attrs[m] for m in objectives], user_attrs=attrs))
    return study


def test_a_study_of_another_objective_shows_it_in_its_tables_and_plots(tmp_path: Path) -> None:
    """top-1 against training seconds: the best table gets a `train s` column, the Pareto plot its axis and front."""
    spec = load_study_spec(write_study(tmp_path / "s.yaml", base=TINY_BASE, objectives=["top1", "train_seconds"],
                                       pruner={"name": "none"}))
    study = _study(["top1", "train_seconds"])
    console = Console(width=200, record=True)
    console.print(trial_table("front", study.trials, study.trials, spec))
    text = console.export_text()
    assert "train s" in text and "50.0" in text, text

    y, x, points = study_points(study)
    assert (y.name, x.name, x.label) == ("top1", "train_seconds", "train s")
    assert sorted(p["number"] for p in points if p["front"]) == [0, 1, 3]  # trial 2: slower and less accurate than 0
    written = write_study_plots(study, tmp_path)
    assert written["pareto_front"] == "written" and (tmp_path / "pareto_front.png").stat().st_size > 5000


def test_a_trial_that_never_reached_its_target_is_worst_and_off_the_plot() -> None:
    objective = OBJECTIVES["time_to_target"]
    assert not objective.maximize and objective.show(math.inf) == "never" and objective.show(12.34) == "12.3"
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_metric_names(["top1", "time_to_target"])
    for number, seconds in enumerate([math.inf, 12.0]):
        attrs = {"top1": 0.9, "time_to_target": seconds}
        study.add_trial(create_trial(params={"method.warmup_frac": 0.1 + 0.1 * number}, distributions=SPACE,
                                     values=[0.9, seconds], user_attrs=attrs))
    _, x, points = study_points(study)
    assert x.name == "time_to_target" and [p["number"] for p in points] == [1]


@pytest.mark.slow
def test_a_study_of_top1_against_predicted_time_on_the_paper_s_cluster_runs_end_to_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    targeted = {**TINY_BASE, "train": {**TINY_BASE["train"], "target_top1": 0.3}}
    study = write_study(tmp_path / "s.yaml", base=targeted, objectives=["top1", "predicted_time_to_target"], trials=3,
                        pruner={"name": "none"}, cluster="paper-a100-hdr200", references={"paper_defaults": False})
    run_cli("study", "create", str(study), "--storage", url, cwd=tmp_path)
    run_cli("study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path)
    cluster = load_cluster("paper-a100-hdr200")
    trials = trials_of(url)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3  # the ddp reference and two searched trials
    for trial in trials:
        summary = read_summary(Path(trial.user_attrs["run_dir"])).raw
        predicted = predict(summary, cluster).time_to_target_seconds
        assert summary["predicted"]["cluster"] == "paper-a100-hdr200"
        assert trial.values[1] == trial.user_attrs["predicted_time_to_target"] == pytest.approx(predicted)
        assert 0 < trial.values[1] <= summary["predicted"]["train_seconds"] or math.isinf(trial.values[1])
    best = run_cli("study", "best", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert "predicted s to target" in best
