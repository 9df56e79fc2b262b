"""What a user sees in the MLflow UI after a study, checked in a real headless browser (Debian's chromium).

A 2-trial study (the DDP reference and one AB trial) on real stores in the working directory; `abtune ui`
without options starts the dashboards and prints the study experiment's link; chromium opens that link,
lets the React app fetch its data, saves a screenshot and dumps the DOM; then it opens the DDP trial's metrics
tab the same way, from the same `abtune ui`. The screenshot goes to
$ABTUNE_SCREENSHOT_DIR if set (pytest removes old tmp_path folders), else to the test's tmp_path.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from abtune.tracking.records import HEADLINE, HEADLINE_SECTION, TOP1_PERCENT
from abtune.tracking.view import RESULT_METRICS
from tests import browser
from tests.conftest import run_cli
from tests.study_helpers import TINY_BASE, write_study

pytestmark = pytest.mark.slow
SCREENSHOT_DIR_VARIABLE = "ABTUNE_SCREENSHOT_DIR"


def _experiment_links(cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`abtune ui`, and the experiment links it printed (name -> link)."""
    process, lines = browser.start_ui(cwd, env)
    links = [line.split(": ", 1) for line in lines if line.startswith("  experiment ")]
    return process, {name.removeprefix("  experiment "): link for name, link in links}


def test_the_study_experiment_opens_on_its_trials_and_their_results(tmp_path: Path, mlflow_db: Path) -> None:
    browser.chromium()  # before the study: skip (or fail in CI) early
    mlflow_db.rename(tmp_path / "mlflow.db")  # the default stores, where the quickstart leaves them
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "ABTUNE_STORAGE")}
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "steps": 20}}
    study = write_study(tmp_path / "s.yaml", base=base, trials=2, references={"paper_defaults": False, "ddp": True})
    run_cli("study", "create", str(study), cwd=tmp_path, env=env)
    run_cli("study", "run", "tiny", cwd=tmp_path, env=env)

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    trials = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])
              if r.data.tags.get("abtune.role") == "trial"}
    assert len(trials) == 2

    (ddp,) = [r for r in trials.values() if r.data.tags["optuna.trial_number"] == "0"]
    process, links = _experiment_links(tmp_path, env)  # once, for both pages
    try:
        assert set(links) == {"tiny"}
        screenshot = Path(os.environ.get(SCREENSHOT_DIR_VARIABLE) or tmp_path) / "mlflow-study-experiment.png"
        dom = browser.render(links["tiny"], screenshot, tmp_path / "chromium-profile")
        page = links["tiny"].split("/runs?")[0] + f"/runs/{ddp.info.run_id}/model-metrics"
        trial_dom = browser.render(page, screenshot.with_name("mlflow-trial-metrics.png"),
                                   tmp_path / "chromium-profile")
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
    print(f"screenshot of the study experiment: {screenshot}")

    assert "Overview" not in dom and "Error loading shared view state" not in dom  # the model-training view
    rows = browser.grid_rows(dom)
    shown = {run_id: row for run_id, row in rows.items() if run_id in trials}
    assert set(shown) == set(trials), f"runs table rows: {sorted(rows)}"
    for run_id, row in shown.items():
        run = trials[run_id]
        assert run.info.run_name in row.cells["attributes.`Run Name`"]
        assert row.cells[f"metrics.`{TOP1_PERCENT}`"] == _as_javascript_shows(run.data.metrics[TOP1_PERCENT])
        assert row.cells["params.`method`"] == run.data.params["method"]
        data_columns = [c for c, _ in sorted(row.columns.items(), key=lambda item: item[1])
                        if c.startswith(("metrics.", "params."))]
        assert data_columns[:len(RESULT_METRICS)] == [f"metrics.`{m}`" for m in RESULT_METRICS]  # results first
    by_place = sorted(shown, key=lambda run_id: shown[run_id].position)
    top1 = [trials[run_id].data.metrics["final_top1"] for run_id in by_place]
    assert top1 == sorted(top1, reverse=True)  # best final top-1 first

    # A trial's page: its name says what it is, its results are the first section of its metrics tab.
    assert ddp.info.run_name == "trial-0 · DDP reference"
    assert "trial-0 · DDP reference" in trial_dom
    sections = browser.chart_sections(trial_dom)
    assert sections[0] == (HEADLINE_SECTION, len(HEADLINE)), sections


def _as_javascript_shows(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)
