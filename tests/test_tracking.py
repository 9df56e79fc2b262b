"""MLflow tracking in one process, on a real SQLite store: URIs and credentials, the metric
conversion, replay from metrics.jsonl, and a study's parent run with its plots."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.config import RunConfig
from abtune.errors import ConfigError
from abtune.launch.local import free_port
from abtune.phases import Phase
from abtune.study import importance
from abtune.study.importance import analysis
from abtune.tracking import LaunchInfo, open_tracking, resolve_tracking_uri
from abtune.tracking.records import MetricStream, records_points
from abtune.tracking.study_plots import study_points
from abtune.tracking.uri import RedactingFilter, export_tracking_uri
from tests.conftest import TINY_VIT, CliResult, write_config

SECRET = "hunter2-s3cret"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def store(mlflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_the_uri_comes_from_the_flag_then_the_environment_then_a_sqlite_file_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///sub/x.db", tmp_path) == f"sqlite:///{tmp_path.resolve() / 'sub/x.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert resolve_tracking_uri(None, tmp_path) == "http://tracking:5000"
    assert resolve_tracking_uri("http://other:80", tmp_path) == "http://other:80"


def test_a_password_in_the_uri_moves_into_mlflows_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = export_tracking_uri(f"https://alice:{SECRET}@mlflow.example.org:8443/prefix")
    assert shown == "https://mlflow.example.org:8443/prefix"
    assert os.environ["MLFLOW_TRACKING_URI"] == shown
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == ("alice", SECRET)


def test_mlflow_log_lines_are_redacted() -> None:
    record = logging.LogRecord("mlflow.x", logging.WARNING, __file__, 1, "request to %s failed",
                               (f"postgresql://bob:{SECRET}@db/x",), None)
    RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and "bob:***@db" in record.getMessage()


def _log(step: int, phase: str, seconds: float, inter: float) -> dict:
    return {"kind": "log", "step": step, "phase": phase, "loss": 1.0 / step, "lr": 0.01, "step_seconds": seconds,
            "total_bytes": 2 * inter, "inter_node_bytes": inter, "intra_node_bytes": inter,
            "phase_bytes": {phase: inter}, "phase_inter_node_bytes": {phase: inter / 2, "eval": inter / 4}}


def test_records_become_step_metrics_with_cumulative_gb_per_s() -> None:
    stream = MetricStream()
    first = {p.key: p for p in stream.log_points(_log(10, "warmup", 0.5, 5e9))}
    second = {p.key: p for p in stream.log_points(_log(20, "ab", 0.25, 10e9))}
    # Training phases' inter-node bytes per training second: the evaluation's bytes are not training traffic.
    assert first["traffic/training_inter_node_gb_per_s"].value == pytest.approx(2.5 / (10 * 0.5))
    assert second["traffic/training_inter_node_gb_per_s"].value == pytest.approx(5 / (10 * 0.5 + 10 * 0.25))
    assert second["train/phase"].value == Phase.AB.code and second["train/phase"].step == 20
    assert second["traffic/bytes_ab"].value == 10e9 and second["traffic/inter_node_bytes_ab"].value == 5e9
    evaluation = MetricStream.evaluation_points({"step": 20, "val_top1": 0.5, "val_top5": None, "val_loss": 1.2,
                                                 "model_compression": float("inf"), "trainable_params": 100})
    assert {p.key for p in evaluation} == {"val/top1", "val/loss", "model/trainable_params"}  # None, inf skipped
    evaluation = MetricStream.evaluation_points({"step": 20, "model_compression": 2.5, "dense_over_current": 1.0})
    assert {p.key: p.value for p in evaluation} == {"model/compression": 2.5, "model/dense_over_current": 1.0}


def _fake_run_dir(folder: Path) -> Path:
    folder.mkdir()
    config = RunConfig.model_validate({"name": "fake", "model": TINY_VIT, "method": {"name": "ab"},
                                       "train": {"steps": 30}})
    (folder / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    records = [_log(s, "warmup" if s <= 6 else "ab", 0.01, 1e6 * s) for s in (5, 10, 15, 20, 25, 30)]
    records += [{"kind": "evaluation", "step": s, "epoch": 1.0, "phase": "ab", "loss": 1.0, "val_top1": s / 100,
                 "val_top5": 0.9, "val_loss": 1.1, "compression": 1.3, "trainable_params": 1000,
                 "inter_node_bytes": 1.0, "intra_node_bytes": 1.0} for s in (15, 30)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_finish_run_replays_what_rank_0_could_not_log_exactly_once(store: str, tmp_path: Path) -> None:
    run_dir = _fake_run_dir(tmp_path / "run")
    tracking = open_tracking()
    config = RunConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    run_id = tracking.start_run(config, experiment="fake", run_name="r", launch_info=LaunchInfo("local", 4, 2))

    assert tracking.finish_run(run_id, run_dir, "FINISHED") == "replayed"  # nothing was logged live
    assert tracking.finish_run(run_id, run_dir, "FINISHED") == "complete"  # and nothing twice

    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["abtune.logging"] == "complete"
    expected = records_points(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    for key in {p.key for p in expected}:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(steps) == [p.step for p in expected if p.key == key], key
    params = run.data.params
    assert (params["method.warmup_steps"], params["method.ab_steps"], params["method.ab_cycles"]) == ("6", "1", "24")
    assert (params["world_size"], params["nodes"], params["group_size"], params["launcher"]) == ("4", "2", "2", "local")
    names = {a.path for a in client.list_artifacts(run_id, "plots")}
    assert names == {"plots/accuracy_loss.png"}  # no summary.json: no traffic or spectra plot


def _study(storage: str) -> optuna.Study:
    study = optuna.create_study(study_name="tiny-study", storage=storage, directions=["maximize", "minimize"])
    study.set_metric_names(["top1", "inter_node_bytes"])
    space = {"warmup_frac": FloatDistribution(0.0, 0.5), "sigma_cutoff": FloatDistribution(0.01, 0.5)}
    trials = [  # (top1, inter-node bytes, params, reference)
        (0.97, 256e6, {"warmup_frac": 0.2, "sigma_cutoff": 0.1}, "ddp"),
        (0.95, 107e6, {"warmup_frac": 0.2, "sigma_cutoff": 0.1}, "paper-defaults"),
        (0.93, 60e6, {"warmup_frac": 0.05, "sigma_cutoff": 0.3}, None),
        (0.96, 140e6, {"warmup_frac": 0.35, "sigma_cutoff": 0.05}, None),
        (0.90, 150e6, {"warmup_frac": 0.3, "sigma_cutoff": 0.2}, None),  # dominated
        (0.94, 90e6, {"warmup_frac": 0.1, "sigma_cutoff": 0.15}, None),
    ]
    for top1, nbytes, params, reference in trials:
        attrs = {"top1": top1, "inter_node_bytes": nbytes, **({"reference": reference} if reference else {})}
        study.add_trial(create_trial(params=params, distributions=space, values=[top1, nbytes], user_attrs=attrs))
    return study


def test_a_study_has_one_parent_run_with_its_front_importances_and_history(store: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # p-values against 3 shufflings, not 19: what is checked here is what the parent run stores and draws, not
    # the p-values (tests/test_importance_uncertainty.py's); 19 of these trials' orders are 30 more forests
    monkeypatch.setattr(importance, "against_shuffled", functools.partial(importance.against_shuffled, permutations=3))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = _study(storage)
    y, x, points = study_points(study.trials, study.metric_names)
    assert (y.name, x.name) == ("top1", "inter_node_bytes")
    points = {p["number"]: p for p in points}
    assert [n for n, p in sorted(points.items()) if p["front"]] == [1, 2, 3, 5]  # the search's: DDP (0) is not on it
    assert points[0]["reference"] == "ddp" and points[1]["reference"] == "paper-defaults"

    tracking = open_tracking()
    described = f"postgresql://optuna:{SECRET}@db.example.org/studies"
    parent = tracking.study_parent_run("tiny-study", described)
    assert tracking.study_parent_run("tiny-study", described) == parent  # found again when a study resumes
    objectives = ["top1", "inter_node_bytes"]
    tracking.update_study_artifacts(parent, study.trials, study.metric_names,
                                    analysis(study.trials, ["warmup_frac", "sigma_cutoff"], objectives))

    client = MlflowClient(store)
    run = client.get_run(parent)
    assert run.data.tags["optuna.storage"] == "postgresql://optuna:***@db.example.org/studies"
    assert run.data.tags["abtune.plot.importances"] == "written"
    folder = Path(client.download_artifacts(parent, "study", str(tmp_path / "download")))
    for name in ("pareto_front.png", "importances.png", "optimization_history.png"):
        data = (folder / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    stored = json.loads((folder / "importances.json").read_text())
    assert set(stored["importances"]) == set(objectives) and stored["inert"] == []
    for by_param in stored["importances"].values():
        assert set(by_param) == {"warmup_frac", "sigma_cutoff"} and sum(by_param.values()) == pytest.approx(1.0)

    config = RunConfig.model_validate({"name": "t", "model": TINY_VIT})
    study.enqueue_trial({}, user_attrs={"reference": "ddp"})
    reference = study.ask()
    named = tracking.start_trial_run(config, reference, study_name="tiny-study", parent_run_id=parent)
    assert client.get_run(named).info.run_name == f"trial-{reference.number} · DDP reference"  # says what it is
    study.tell(reference, state=optuna.trial.TrialState.FAIL)
    trial = study.ask()
    child = tracking.start_trial_run(config, trial, study_name="tiny-study", parent_run_id=parent)
    assert client.get_run(child).info.run_name == f"trial-{trial.number}"
    tags = client.get_run(child).data.tags
    assert (tags["mlflow.parentRunId"], tags["optuna.study"], tags["abtune.role"]) == (parent, "tiny-study", "trial")
    assert tags["optuna.trial_number"] == str(trial.number) == "7"
    assert study.trials[trial.number].user_attrs["mlflow_run_id"] == child
    assert client.get_run(child).info.experiment_id == run.info.experiment_id


@pytest.mark.parametrize(("scheme", "shown"), [("http", "http"), ("postgresql", "postgresql+psycopg2")])
def test_an_unreachable_store_stops_abtune_train_before_anything_starts(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                                        scheme: str, shown: str) -> None:
    config = write_config(tmp_path / "run.yaml")
    port = free_port()
    closed = f"{scheme}://bob:{SECRET}@127.0.0.1:{port}" + ("/abtune" if scheme == "postgresql" else "")
    result = abtune_main("train", str(config), "--run-dir", str(tmp_path / "run"), "--tracking-uri", closed,
                         env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    assert result.returncode == 1
    assert result.stderr.startswith(f"abtune: error: cannot reach MLflow at {shown}://"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "--no-tracking" in result.stderr and "Traceback" not in result.stderr and SECRET not in result.stderr
    assert not (tmp_path / "run").exists()


def test_abtune_ui_refuses_a_store_that_does_not_exist(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    result = abtune_main("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.returncode == 2 and result.stderr.startswith("abtune: error: no MLflow store at sqlite:///")
    assert not (tmp_path / "none.db").exists()


def test_abtune_ui_without_options_serves_the_default_stores_found_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        abtune_main: Callable[..., CliResult]) -> None:
    from abtune.study.storage import STORAGE_VARIABLE
    from abtune.ui import choose_stores

    result = abtune_main("ui", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": None, STORAGE_VARIABLE: None})
    assert result.returncode == 2
    assert result.stderr == ("abtune: error: no ./mlflow.db or ./optuna.db here; run abtune ui where you trained, "
                             "or pass --tracking-uri / --storage\n")

    # abtune_main left the test in tmp_path with both variables unset
    optuna.create_study(study_name="here", storage="sqlite:///optuna.db")
    assert choose_stores(None, None) == (None, f"sqlite:///{tmp_path / 'optuna.db'}")
    said = capsys.readouterr().out
    assert "no mlflow.db here, so no MLflow store" in said
    assert f"found Optuna storage sqlite:///{tmp_path / 'optuna.db'}" in said

    MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    assert choose_stores(None, None) == (f"sqlite:///{tmp_path / 'mlflow.db'}", f"sqlite:///{tmp_path / 'optuna.db'}")
    assert "found MLflow store sqlite:///" in capsys.readouterr().out
    monkeypatch.setenv(STORAGE_VARIABLE, f"sqlite:///{tmp_path / 'elsewhere.db'}")  # asked for: must exist
    with pytest.raises(ConfigError, match="^no Optuna storage at sqlite:///.*elsewhere.db; check --storage"):
        choose_stores(None, None)


def test_experiments_open_as_model_training_with_the_results_first(store: str) -> None:
    from abtune.tracking.view import RESULT_METRICS, VIEW_KEY, experiment_links

    client = MlflowClient(store)
    older = client.create_experiment("from-before")  # as an older abtune left it: no tags
    tracking = open_tracking()
    config = RunConfig.model_validate({"name": "t", "model": TINY_VIT})
    tracking.start_run(config, experiment="fresh", run_name="r")
    tracking.start_run(config, experiment="from-before", run_name="r")
    for name in ("fresh", "from-before"):
        tags = client.get_experiment_by_name(name).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        view = json.loads(tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
        assert view["selectedColumns"][:4] == [f"metrics.`{m}`" for m in RESULT_METRICS]
        assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`Results/top-1`", False)
    links = dict(experiment_links(store, "http://127.0.0.1:5000", limit=10))
    assert links["from-before"] == (f"http://127.0.0.1:5000/#/experiments/{older}/runs"
                                    f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
    assert set(links) == {"fresh", "from-before"}  # not MLflow's Default experiment
