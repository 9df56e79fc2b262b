"""A multi-objective study with `pruner: pareto-asha`, end to end: real trials, SQLite, MLflow."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from abtune.attrs import DDP, EVALUATIONS_ATTR, PAPER_DEFAULTS, REFERENCE_ATTR
from abtune.runfiles import complete_checkpoints, read_summary
from abtune.study import recommendation
from abtune.study.definition import open_search_study
from abtune.study.storage import open_storage
from tests.conftest import CliResult
from tests.study_cli import in_process
from tests.study_helpers import trials_of, write_study

Abtune = Callable[..., CliResult]

pytestmark = pytest.mark.slow
OPTIONS = {"first_rung": 0.3, "reduction_factor": 2, "min_trials": 2}  # 30 steps: rungs at 9 and 18


def test_pruned_trials_are_marked_everywhere_and_keep_their_checkpoint(tmp_path: Path, mlflow_db: Path,
                                                                        abtune_main: Abtune) -> None:
    """Trials whose learning rate is far too low trail the paper-defaults trial at a rung and stop; each
    decision is the pruner's rule applied to the trials that had reached the rung before; pruned
    trials are PRUNED in status, best, export and MLflow, keep their last checkpoint, and are never
    chosen for confirmation; the predicted bytes of the last evaluation are the trial's bytes."""
    url, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{mlflow_db}"
    study = write_study(tmp_path / "s.yaml", trials=6, objectives=["top1", "inter_node_bytes"],
                        space={"optimizer.lr": {"low": 1e-7, "high": 3e-3, "log": True}},
                        pruner={"name": "pareto-asha", "options": OPTIONS})
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)
    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--tracking-uri", tracking, cwd=tmp_path)

    trials = trials_of(url)
    assert [t.user_attrs.get(REFERENCE_ATTR) for t in trials[:2]] == [PAPER_DEFAULTS, DDP]
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert EVALUATIONS_ATTR not in trials[1].user_attrs  # DDP, outside the search space, reports nothing
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned and trials[0].state == TrialState.COMPLETE, [(t.number, t.state, t.params) for t in trials]

    study_obj, _ = open_search_study(open_storage(url), "tiny")
    for trial in trials[2:]:
        _check_decision(study_obj.pruner, trials, trial)
    for trial in trials:
        summary = read_summary(Path(trial.user_attrs["run_dir"]))
        if trial.state == TrialState.PRUNED:
            assert summary.stopped_early == "pruned" and summary.steps_done < summary.raw["steps"]
            checkpoints = complete_checkpoints(Path(trial.user_attrs["run_dir"]))
            assert checkpoints and int(checkpoints[-1].name.removeprefix("step_")) == summary.steps_done
        elif trial.number != 1:
            final = trial.user_attrs[EVALUATIONS_ATTR]["30"]
            assert final["inter_node_bytes"] == pytest.approx(trial.values[1], rel=1e-9)
            assert final["top1"] == trial.values[0]
    front = {t.number for t in study_obj.best_trials}  # what `study confirm --top K` picks from
    assert front and not {t.number for t in pruned} & (front | set(recommendation.require(study_obj).ranked))

    status = in_process(abtune_main, "study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert f"pruned {len(pruned)}" in status, status
    best = in_process(abtune_main, "study", "best", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert f"{len(pruned)} trial(s) pruned (pareto-asha" in best and \
        f"{pruned[0].number} at step {pruned[0].user_attrs['steps_done']}" in best, best
    in_process(abtune_main, "study", "export", "tiny", "--format", "json", "--output", str(tmp_path / "t.json"),
               "--storage", url, cwd=tmp_path)
    exported = {r["number"]: r for r in json.loads((tmp_path / "t.json").read_text())["trials"]}
    for trial in pruned:
        row = exported[trial.number]
        assert (row["state"], row["stopped_early"], row["value_top1"]) == ("PRUNED", "pruned", None)
    _check_mlflow(tracking, trials)


def _check_decision(pruner: optuna.pruners.BasePruner, trials: list, trial: optuna.trial.FrozenTrial) -> None:
    """One trial at a time: at each of its rungs, the trials before it were its competition."""
    earlier = optuna.create_study(directions=["maximize", "minimize"])
    for other in trials[:trial.number]:
        if other.user_attrs.get(REFERENCE_ATTR) != DDP:
            earlier.add_trial(other)
    steps = sorted(int(s) for s in trial.user_attrs[EVALUATIONS_ATTR])
    decisions = []
    for i in range(1, len(steps) + 1):
        seen = {str(s): trial.user_attrs[EVALUATIONS_ATTR][str(s)] for s in steps[:i]}
        partial = optuna.trial.create_trial(state=TrialState.RUNNING, params=trial.params,
                                            distributions=trial.distributions,
                                            user_attrs={**trial.user_attrs, EVALUATIONS_ATTR: seen})
        earlier.add_trial(partial)
        decisions.append(pruner.prune(earlier, earlier.get_trials()[-1]))
        earlier._storage.set_trial_state_values(earlier.get_trials()[-1]._trial_id, TrialState.FAIL)
    if trial.state == TrialState.PRUNED:  # stopped at its last evaluation, and not before
        assert decisions[-1] and not any(decisions[:-1]), (trial.number, decisions)
    else:
        assert not any(decisions[:-1]), (trial.number, decisions)


def _check_mlflow(tracking: str, trials: list) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    runs = {r.info.run_id: r for r in client.search_runs([client.get_experiment_by_name("tiny").experiment_id])}
    parent = next(r for r in runs.values() if r.data.tags.get("abtune.role") == "study")
    plots = {a.path: a.file_size for a in client.list_artifacts(parent.info.run_id, "study")}
    assert plots.get("study/evaluations.png", 0) > 0, plots  # the curves the pruner read
    for trial in trials:
        run = runs[trial.user_attrs["mlflow_run_id"]]
        if trial.state == TrialState.PRUNED:
            assert run.data.tags["abtune.stopped_early"] == "pruned"
            assert run.data.tags["abtune.stopped_at_step"] == str(trial.user_attrs["steps_done"])
        else:
            assert "abtune.stopped_early" not in run.data.tags
        if trial.number != 1:  # the numbers the pruner ranked on, as curves
            history = client.get_metric_history(run.info.run_id, "traffic/predicted_training_inter_node_bytes")
            assert {str(m.step): m.value for m in history} == {  # unknown (None) before AB's first sync
                s: v["inter_node_bytes"] for s, v in trial.user_attrs[EVALUATIONS_ATTR].items()
                if v["inter_node_bytes"] is not None}
