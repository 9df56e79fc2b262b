"""Real studies: real storages, real multi-process trials, no mocks."""

from __future__ import annotations

import csv
import functools
import io
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import ARTIFACTS_AT_ATTR, ARTIFACTS_COST_ATTR, DDP, PAPER_DEFAULTS
from abtune.runfiles import read_summary
from abtune.study import results
from abtune.study.runner import INTERRUPTED, claim_study_artifacts
from abtune.study.storage import open_storage
from tests.conftest import CliResult, wait_for
from tests.study_cli import in_process
from tests.study_helpers import TINY_BASE, running, signal_group, start_run, trials_of, write_study

pytestmark = pytest.mark.slow
FINISHED = {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL}


def _param_sets(trials: list[FrozenTrial]) -> list[tuple]:
    """Parameter sets the sampler chose (a retry repeats its trial's set on purpose)."""
    return [tuple(sorted(t.params.items())) for t in trials
            if t.user_attrs.get("retry_of") is None and not results.replaced(t) and t.params]


def _summary(trial: FrozenTrial) -> dict:
    return read_summary(Path(trial.user_attrs["run_dir"])).raw


def test_parallel_study_with_pruning(tmp_path: Path, mlflow_db: Path, abtune_main: Callable[..., CliResult]) -> None:
    """Two trials at a time on SQLite; a median pruner against the paper-defaults trial prunes
    trials whose learning rate is far too low; every trial ends finished; a restart changes nothing;
    MLflow holds the study's parent run and one child run per trial, linked both ways."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    tracking = f"sqlite:///{mlflow_db}"
    study = write_study(tmp_path / "s.yaml", trials=4, space={"optimizer.lr": {"low": 1e-7, "high": 3e-3, "log": True}},
                        pruner={"name": "median", "options": {"n_startup_trials": 1}})
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
    in_process(abtune_main, "study", "run", "tiny", "--parallel", "2", "--storage", url, "--tracking-uri", tracking,
               cwd=tmp_path)  # the installed command's study runs: start_run, below and in other files

    trials = trials_of(url)
    assert len(trials) == 4 and {t.state for t in trials} <= FINISHED, [t.state for t in trials]
    assert [t.user_attrs.get("reference") for t in trials[:2]] == [PAPER_DEFAULTS, DDP]
    first_search_start = min(t.datetime_start for t in trials[2:])
    assert all(t.datetime_start <= first_search_start for t in trials[:2])  # the references started first
    params = _param_sets(trials)
    assert len(params) == len(set(params)) == 3  # the DDP trial has no parameters
    assert trials[1].params == {} and _summary(trials[1])["method"] == "ddp"
    for trial in (t for t in trials if t.state == TrialState.COMPLETE):
        assert trial.values == [_summary(trial)["final"]["val_top1"]]
        assert trial.user_attrs["wall_seconds"] > trial.user_attrs["train_seconds"] > 0
        assert trial.user_attrs["launcher"] == "local"  # what `study best` names to run it again

    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [(t.number, t.state, t.params, t.intermediate_values) for t in trials]
    paper = trials[0].intermediate_values
    assert sorted(paper) == [10, 20, 30]  # the reference reports every evaluation and is never pruned
    for trial in pruned:
        summary = _summary(trial)
        assert summary["stopped_early"] == "pruned" and summary["steps_done"] < summary["steps"]
        step = summary["steps_done"]
        assert trial.user_attrs["steps_done"] == step == max(trial.intermediate_values)
        assert trial.intermediate_values[step] < paper[step]

    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--tracking-uri", tracking, cwd=tmp_path)  # no work
    assert [(t.number, t.state, t.values) for t in trials_of(url)] == [(t.number, t.state, t.values) for t in trials]
    _check_exports(tmp_path, url, trials, abtune_main)
    _check_mlflow(tracking, trials)
    storage = open_storage(url)
    rebuilt = storage.get_study_system_attrs(storage.get_study_id_from_name("tiny"))
    assert 0 < rebuilt[ARTIFACTS_COST_ATTR] < 600 and rebuilt[ARTIFACTS_AT_ATTR] <= time.time()  # what paces the next


def _check_mlflow(tracking: str, trials: list[FrozenTrial]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("abtune.role") == "study"]
    assert len(parents) == 1  # the second `study run` found it again
    parent = parents[0].info.run_id
    children = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent}
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == set(children)
    for trial in trials:
        child = children[trial.user_attrs["mlflow_run_id"]]
        assert child.data.tags["optuna.trial_number"] == str(trial.number)
        assert child.info.status == ("FINISHED" if trial.state in (TrialState.COMPLETE, TrialState.PRUNED) else "FAILED")
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")]
        assert steps == sorted(steps) and steps[-1] == _summary(trial)["steps_done"]
        assert child.data.metrics["inter_node_bytes"] == _summary(trial)["traffic"]["inter_node_bytes"]["mean"]
    plots = {a.path: a.file_size for a in client.list_artifacts(parent, "study")}
    assert plots.get("study/optimization_history.png", 0) > 0 and plots.get("study/pareto_front.png", 0) > 0, plots


def _check_exports(tmp_path: Path, url: str, trials: list[FrozenTrial], abtune_main: Callable[..., CliResult]) -> None:
    assert abtune_main("study", "export", "tiny", "--format", "json", "--output", str(tmp_path / "t.json"),
                       "--storage", url, cwd=tmp_path).returncode == 0
    exported = json.loads((tmp_path / "t.json").read_text())
    assert exported["objectives"] == ["top1"] and exported["definition"]["trials"] == 4
    assert [(r["number"], r["state"], r["value_top1"]) for r in exported["trials"]] == [
        (t.number, t.state.name, t.values[0] if t.values else None) for t in trials]
    assert [r["param_optimizer.lr"] for r in exported["trials"]] == [t.params.get("optimizer.lr") for t in trials]
    text = abtune_main("study", "export", "tiny", "--format", "csv", "--storage", url, cwd=tmp_path).stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(int(r["number"]), r["state"]) for r in rows] == [(t.number, t.state.name) for t in trials]
    assert [r["reference"] for r in rows[:2]] == [PAPER_DEFAULTS, DDP]
    for row, trial in zip(rows, trials, strict=True):
        assert float(row["top1"]) == pytest.approx(trial.user_attrs["top1"], rel=1e-12)
        assert float(row["inter_node_mb"]) * 1e6 == pytest.approx(trial.user_attrs["inter_node_bytes"])


def test_interrupt_kill_and_resume_complete_the_budget(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """Ctrl-C leaves nothing RUNNING; a SIGKILLed worker's trial is found stale, failed and retried
    from its checkpoint; the budget is met with no lost and no duplicated trial (journal storage);
    `best` of this multi-objective study shows its Pareto front."""
    url = f"journal:{tmp_path}/journal.log"
    train = {"steps": 200, "local_batch_size": 16, "eval_every": 100, "log_every": 10, "checkpoint_every": 40}
    study = write_study(tmp_path / "s.yaml", trials=2, references={"paper_defaults": True, "ddp": False},
                        base={**TINY_BASE, "train": train}, objectives=["top1", "inter_node_bytes"])
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0

    def checkpointed_running_trial() -> int | None:
        for trial in running(url):
            run_dir = trial.user_attrs.get("run_dir")
            if run_dir and list(Path(run_dir).glob("checkpoints/step_*/COMPLETE")):
                return trial.number
        return None

    worker = start_run(tmp_path, "tiny", "--storage", url, "--no-tracking")
    interrupted = wait_for(checkpointed_running_trial, 300, "a running trial with a checkpoint")
    signal_group(worker, signal.SIGINT)  # Ctrl-C on a terminal reaches the whole process group
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 130 and "no trial is left running" in err, err
    # what to copy: the storage and tracking it ran with, not the default ./optuna.db
    assert err.rstrip().endswith(f"Continue with: abtune study run tiny --storage {url} --no-tracking"), err
    trials = trials_of(url)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert trials[interrupted].state == TrialState.FAIL and trials[interrupted].user_attrs["fail_reason"] == INTERRUPTED
    assert [t.user_attrs.get("retry_of") for t in trials if t.state == TrialState.WAITING] == [interrupted]

    worker = start_run(tmp_path, "tiny", "--storage", url, "--no-tracking")
    killed = wait_for(checkpointed_running_trial, 300, "a running trial with a checkpoint")
    signal_group(worker, signal.SIGKILL)
    worker.wait(timeout=60)
    assert [t.number for t in running(url)] == [killed]  # left behind by the dead worker

    best = in_process(abtune_main, "study", "run", "tiny", "--parallel", "2", "--storage", url, "--no-tracking",
                      cwd=tmp_path).stdout
    trials = trials_of(url)
    assert {t.state for t in trials} <= FINISHED
    assert trials[killed].state == TrialState.FAIL and trials[killed].user_attrs["fail_reason"].startswith("stale")
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == killed)
    assert retry.state == TrialState.COMPLETE and retry.params == trials[killed].params
    assert retry.user_attrs["resumed_from_step"] >= 40 and retry.user_attrs["steps_done"] == 200
    assert results.budget_used(trials) == results.finished_count(trials) == 2  # none lost
    params = _param_sets(trials)
    assert len(params) == len(set(params))  # none duplicated
    assert sum(1 for t in trials if not results.replaced(t) and t.state == TrialState.COMPLETE) == 2

    front = results.pareto_front(results.search_trials(trials), ["top1", "inter_node_bytes"])
    assert f"Pareto front (top1, inter_node_bytes): {len(front)} trial(s)" in best
    for trial in front:
        assert f"{trial.user_attrs['inter_node_bytes'] / 1e6:.2f}" in best
    status = abtune_main("study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert "budget 2/2 finished" in status and "re-enqueued" in status


def test_the_workers_of_a_study_rebuild_its_plots_once_a_minute_between_them(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}", create=True)
    study_id = storage.create_new_study([StudyDirection.MAXIMIZE], "shared")
    claim = functools.partial(claim_study_artifacts, storage, study_id, every_s=3600)
    assert claim()  # the first worker whose trial ends
    assert not claim()  # every other worker within the interval: already done for the study
    assert not claim(ended_at=time.time() - 60)  # a worker ending whose last trial the rebuild saw
    assert claim(ended_at=time.time() + 1)  # one whose last trial ended after it
    assert claim(every_s=0)  # once the interval has passed
    stamp = storage.get_study_system_attrs(study_id)[ARTIFACTS_AT_ATTR]
    assert stamp == pytest.approx(time.time(), abs=60)


def test_a_study_whose_plots_take_long_rebuilds_them_at_most_a_tenth_of_the_time(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}", create=True)
    study_id = storage.create_new_study([StudyDirection.MAXIMIZE], "big")

    def rebuilt(seconds_ago: float, took_s: float) -> None:
        storage.set_study_system_attr(study_id, ARTIFACTS_AT_ATTR, time.time() - seconds_ago)
        storage.set_study_system_attr(study_id, ARTIFACTS_COST_ATTR, took_s)

    rebuilt(seconds_ago=120, took_s=30)  # a 10,000-trial study's plots: half a minute
    assert not claim_study_artifacts(storage, study_id, every_s=60)  # 2 minutes < 10 x 30 s
    assert claim_study_artifacts(storage, study_id, ended_at=time.time() + 1)  # a runner's end still rebuilds
    rebuilt(seconds_ago=301, took_s=30)
    assert claim_study_artifacts(storage, study_id, every_s=60)
    rebuilt(seconds_ago=61, took_s=1)  # a cheap rebuild keeps the minute
    assert claim_study_artifacts(storage, study_id, every_s=60)
