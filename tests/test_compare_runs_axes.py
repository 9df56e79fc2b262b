"""The axes MLflow's compare-runs page opens its parallel-coordinates plot on, for a study's trial runs.

MLflow 3.17 chooses them in the browser (ParallelCoordinatesPlotPanel, nothing stored or linked sets them):
of the parameters whose values differ between the compared runs, the first three by name (JavaScript's
default sort: capitals first); of the metrics every run logged, the first one in the order the store returns
them, which is the order they were first logged. `default_axes` is that rule, applied to the runs as the store
gives them back.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from optuna.distributions import FloatDistribution

from abtune.config import RunConfig
from abtune.tracking import open_tracking
from tests.conftest import TINY_VIT

SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.sigma_cutoff": FloatDistribution(0.04, 0.3),
         "method.ab_frac": FloatDistribution(0.015, 0.07)}
PARAMETER_AXES = 3
METRIC_AXES = 1


def default_axes(runs: list[Run]) -> tuple[list[str], list[str]]:
    """(parameters, metrics) MLflow 3.17's compare page plots first for `runs`."""
    keys = sorted(set().union(*(r.data.params for r in runs)))
    differing = [k for k in keys if len({r.data.params.get(k) for r in runs}) > 1]
    metric_order = [m.key for m in runs[0].data._metric_objs]  # as the REST API lists them
    shared = [k for k in metric_order if all(k in r.data.metrics for r in runs[1:])]
    return sorted(differing)[:PARAMETER_AXES], shared[:METRIC_AXES]


def test_the_compare_page_plots_the_searched_parameters(mlflow_db: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    study = optuna.create_study(study_name="axes", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    study.enqueue_trial({}, user_attrs={"reference": "ddp"})
    tracking = open_tracking()
    ddp_config = RunConfig.model_validate({"name": "t", "model": TINY_VIT})
    ab_config = RunConfig.model_validate({"name": "t", "model": TINY_VIT, "method": {"name": "ab"}})
    ddp = study.ask()
    runs = [tracking.start_trial_run(ddp_config, ddp, study_name="axes", parent_run_id=None)]
    for warmup in (0.15, 0.25):
        trial = study.ask()
        for key, distribution in SPACE.items():
            low, high = (warmup, warmup) if key == "method.warmup_frac" else (distribution.low, distribution.high)
            trial.suggest_float(key, low, high)
        runs.append(tracking.start_trial_run(ab_config, trial, study_name="axes", parent_run_id=None))
    client = MlflowClient(uri)
    for run_id in runs:  # what training logs: the loss first, the results at the end
        client.log_metric(run_id, "train/loss", 2.0)
        client.log_metric(run_id, "Results/top-1", 50.0)

    parameters, metrics = default_axes([client.get_run(r) for r in runs])
    assert parameters == ["Search/ab_frac", "Search/sigma_cutoff", "Search/warmup_frac"], parameters
    assert client.get_run(runs[1]).data.params["Search/warmup_frac"] == "0.15"
    assert "Search/warmup_frac" not in client.get_run(runs[0]).data.params  # DDP searched nothing
    assert metrics == ["train/loss"]  # MLflow's choice: the first metric logged, not settable from here
