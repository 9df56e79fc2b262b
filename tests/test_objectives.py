"""Objectives as one definition each (abtune/objectives.py): the study file, the trial's values, the
tables and the plots all take them from there."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from abtune.errors import ConfigError
from abtune.objectives import OBJECTIVES, pareto_mask
from abtune.runfiles import read_summary
from abtune.study import results
from abtune.study.report.trial_tables import FRONT_ROWS, print_front, print_trials
from abtune.study.spec import load_study_spec
from abtune.timing import load_cluster, predict
from abtune.tracking.study_plots import study_points, write_study_plots
from tests.conftest import CliResult
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
    print_trials(console, "front", study.trials, study.trials, spec)
    text = console.export_text()
    assert "train s" in text and "50.0" in text, text

    y, x, points = study_points(study.trials, study.metric_names)
    assert (y.name, x.name, x.label) == ("top1", "train_seconds", "train s")
    assert sorted(p["number"] for p in points if p["front"]) == [0, 1, 3]  # trial 2: slower and less accurate than 0
    written = write_study_plots(study.trials, study.metric_names, tmp_path)
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
    _, x, points = study_points(study.trials, study.metric_names)
    assert x.name == "time_to_target" and [p["number"] for p in points] == [1]


@pytest.mark.slow
def test_a_study_of_top1_against_predicted_time_on_the_paper_s_cluster_runs_end_to_end(
        tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    targeted = {**TINY_BASE, "train": {**TINY_BASE["train"], "target_top1": 0.3}}
    study = write_study(tmp_path / "s.yaml", base=targeted, objectives=["top1", "predicted_time_to_target"], trials=3,
                        pruner={"name": "none"}, cluster="paper-a100-hdr200", references={"paper_defaults": False})
    for command in (("create", str(study)), ("run", "tiny", "--no-tracking")):  # in this process: imports once
        done = abtune_main("study", *command, "--storage", url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    cluster = load_cluster("paper-a100-hdr200")
    trials = trials_of(url)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3  # the ddp reference and two searched trials
    for trial in trials:
        summary = read_summary(Path(trial.user_attrs["run_dir"])).raw
        predicted = predict(summary, cluster).time_to_target_seconds
        assert summary["predicted"]["cluster"] == "paper-a100-hdr200"
        assert trial.values[1] == trial.user_attrs["predicted_time_to_target"] == pytest.approx(predicted)
        assert 0 < trial.values[1] <= summary["predicted"]["train_seconds"] or math.isinf(trial.values[1])
    best = abtune_main("study", "best", "tiny", "--storage", url, cwd=tmp_path)
    assert best.returncode == 0 and "predicted s to target" in best.stdout, best.stderr


def _front_by_every_pair(scores: list[list[float]]) -> list[bool]:
    def beats(a: list[float], b: list[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))

    return [not any(math.isnan(x) for x in v) and not any(beats(o, v) for o in scores) for v in scores]


@given(st.integers(1, 3).flatmap(lambda d: st.lists(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, -math.inf, math.nan]), min_size=d, max_size=d), max_size=40)))
@settings(max_examples=300, deadline=None)
def test_the_pareto_front_is_what_comparing_every_pair_finds(scores: list[list[float]]) -> None:
    # few distinct values: ties in one component and whole vectors repeated, the cases a sweep gets wrong
    assert pareto_mask(scores) == _front_by_every_pair(scores)


def test_a_front_of_ties_is_found_without_comparing_every_pair() -> None:
    # 2-step trials all tie: at 1000 trials the pairwise front took most of `study best` (issue 25)
    scores = [[0.1, -0.0]] * 20_000 + [[0.1, -1.0], [0.05, 0.0]]
    mask = pareto_mask(scores)
    assert mask[:20_000] == [True] * 20_000 and mask[20_000:] == [False, False]


def test_study_best_shows_the_head_of_a_long_front_and_says_how_long_it_is(tmp_path: Path) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", base=TINY_BASE, pruner={"name": "none"}))
    study = optuna.create_study(directions=["maximize", "minimize"])
    for number in range(FRONT_ROWS + 5):  # every trial alike: all on the front, as 2-step trials were
        attrs = {"top1": 0.1, "inter_node_bytes": 5e6, "compression": 1.0}
        study.add_trial(create_trial(params={"method.warmup_frac": 0.1 + 0.001 * number}, distributions=SPACE,
                                     values=[0.1, 5e6], user_attrs=attrs))
    front = results.pareto_front(study.trials, ["top1", "inter_node_bytes"])
    console = Console(width=300, record=True)
    print_front(console, "tiny", ["top1", "inter_node_bytes"], front, study.trials, spec)
    text = console.export_text()
    title = " ".join(text.split("┏")[0].split())  # rich wraps the title to the table's width
    assert title == (f"Pareto front (top1, inter_node_bytes): {FRONT_ROWS + 5} trial(s), the {FRONT_ROWS} with the "
                     "best top-1 shown (every trial: abtune study export tiny) (parameters: method.*)"), text
    assert text.count("0.1000") == FRONT_ROWS
