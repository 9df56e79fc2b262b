"""What MLflow shows of a study: the parent run describes it (objectives, space, budget) with its plots under
the description, logs its settings and progress, and the recommended and reference trials' runs are tagged."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.config import RunConfig
from abtune.study import parent_run
from abtune.study.spec import parse_study_spec
from abtune.tracking import open_tracking
from abtune.tracking.records import HEADLINE
from tests.conftest import TINY_VIT

HEADER_COLUMN = 15  # characters the MLflow runs table shows of a metric column's header


@pytest.fixture
def store(mlflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _spec():  # type: ignore[no-untyped-def]
    return parse_study_spec({"base": {"name": "t", "model": TINY_VIT, "method": {"name": "ab"}}, "objectives": ["top1", "inter_node_bytes"],
                             "layout": {"nproc": 4, "ranks_per_node": 2}, "trials": 12,
                             "constraints": {"max_inter_node_mb": 150}}, "test")


def _study(storage: str, run_ids: list[str]) -> optuna.Study:
    """Three finished trials (DDP, the paper's defaults, one searched), each linked to its MLflow run."""
    study = optuna.create_study(study_name="tiny-study", storage=storage, directions=["maximize", "minimize"])
    study.set_metric_names(["top1", "inter_node_bytes"])
    space = {"method.warmup_frac": FloatDistribution(0.0, 0.5)}
    results = ((0.97, 256e6, "ddp"), (0.95, 107e6, "paper-defaults"), (0.93, 60e6, None))
    for (top1, nbytes, reference), run_id in zip(results, run_ids, strict=True):
        attrs = {"top1": top1, "inter_node_bytes": nbytes, "mlflow_run_id": run_id,
                 **({"reference": reference} if reference else {})}
        study.add_trial(create_trial(params={"method.warmup_frac": 0.2}, distributions=space, values=[top1, nbytes],
                                     user_attrs=attrs))
    return study


def _described_study(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The tiny study's parent run, described, with a child run per trial: (tracking, parent, runs, study)."""
    spec = _spec()
    tracking = open_tracking()
    parent = tracking.study_parent_run("tiny-study", "sqlite:///optuna.db")
    config = RunConfig.model_validate({"name": "t", "model": TINY_VIT})
    runs = [tracking.start_run(config, experiment="tiny-study", run_name=f"trial-{n}", parent_run_id=parent)
            for n in range(3)]
    study = _study(f"sqlite:///{tmp_path / 'optuna.db'}", runs)
    tracking.describe_study(parent, parent_run.study_description("tiny-study", spec), parent_run.study_params(spec),
                            parent_run.study_progress(study.trials))
    return tracking, parent, runs, study


def test_the_result_metrics_fit_the_runs_tables_column() -> None:
    assert all(len(key) <= HEADER_COLUMN for key in HEADLINE), HEADLINE


def test_the_parent_run_describes_the_study_and_shows_its_plots(store: str, tmp_path: Path) -> None:
    tracking, parent, runs, study = _described_study(tmp_path)
    tracking.update_study_artifacts(parent, study.trials, study.metric_names, None, recommended=2)
    tracking.show_recommendation(parent, {}, {}, runs[2])  # the runner publishes the answer after the plots

    client = MlflowClient(store)
    run = client.get_run(parent)
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**Study tiny-study**: maximize top-1, minimize inter-node MB per rank.")
    assert "`warmup_frac`" in note and "(method.*)" in note  # the section said once
    assert "Budget **12 trials**" in note and "4 ranks per trial on 2 nodes" in note and "**150 MB**" in note
    assert f"![pareto_front](get-artifact?path=study%2Fpareto_front.png&run_uuid={parent})" in note
    assert "optimization_history.png" in note and "importances" not in note  # no analysis: no importance plot
    params = run.data.params
    assert (params["study.trials"], params["study.objectives"], params["space.method.warmup_frac"]) == (
        "12", "top1,inter_node_bytes", "0.1 .. 0.3")
    metrics = run.data.metrics
    assert (metrics["Study/complete"], metrics["Study/failed"], metrics["Study/best top-1"]) == (3, 0, 93.0)
    assert client.get_run(runs[2]).data.tags["abtune.recommended"] == "true"

    tracking.show_recommendation(parent, {}, {}, runs[1])  # choice moves
    assert "abtune.recommended" not in client.get_run(runs[2]).data.tags
    assert client.get_run(runs[1]).data.tags["abtune.recommended"] == "true"


def test_a_reference_trials_run_says_which_reference(store: str, tmp_path: Path) -> None:
    study = optuna.create_study(study_name="refs", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    study.enqueue_trial({}, user_attrs={"reference": "ddp"})
    tracking = open_tracking()
    config = RunConfig.model_validate({"name": "t", "model": TINY_VIT})
    reference = study.ask()
    run_id = tracking.start_trial_run(config, reference, study_name="refs", parent_run_id=None)
    assert MlflowClient(store).get_run(run_id).data.tags["abtune.reference"] == "ddp"


def test_the_description_keeps_the_recommendation_when_the_plots_are_updated(store: str, tmp_path: Path) -> None:
    """The recommendation and the study's plots share the parent run's description: the answer published after a
    plot update sits between the study's text and the plots."""
    from abtune.study import recommendation

    tracking, parent, _, study = _described_study(tmp_path)
    answer = recommendation.current(study)
    assert answer is not None
    tracking.update_study_artifacts(parent, study.trials, study.metric_names, None, recommended=answer.trial)
    recommendation.publish(study, answer, tracking, parent)

    note = MlflowClient(store).get_run(parent).data.tags["mlflow.note.content"]
    text, advice, plots = note.index("**Study tiny-study**"), note.index("## Recommendation"), note.index("![pareto_front]")
    assert text < advice < plots, note
