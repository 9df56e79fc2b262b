"""What a user sees of a finished study in MLflow and optuna-dashboard, in a real headless browser (chromium):
the experiment opened as MLflow's own experiment list links it (no parameters in the link), the study's
parent run, the recommended trial's run, and optuna-dashboard's study, note and trial pages. Each page is saved as a
PNG in $ABTUNE_SCREENSHOT_DIR (else the test's tmp_path) and its DOM checked for what the study stored.

The study is a real `abtune study run` of two trials (DDP and one searched) whose learning
rate is too small to move the model, the searched trial keeping (almost) every singular value: it ends on
DDP's top-1 or close, so the study most likely recommends it; the test checks what is shown either way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from urllib.parse import quote

import optuna
import pytest
from mlflow import MlflowClient

from abtune.attrs import RUN_ID_ATTR
from abtune.study import recommendation
from tests import browser
from tests.conftest import run_cli
from tests.study_helpers import TINY_BASE, write_study
from tests.test_mlflow_view import SCREENSHOT_DIR_VARIABLE

pytestmark = pytest.mark.slow
GENAI_VIEW = ("Detect Issues", "Detect issues", "Token Usage")  # what MLflow's GenAI overview shows


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A 2-trial study run with the default stores of its folder; (folder, environment)."""
    browser.chromium()  # before the study: skip (or fail in CI) early
    folder = tmp_path_factory.mktemp("screenshots")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "ABTUNE_STORAGE")}
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "steps": 10, "eval_every": 10},
            "optimizer": {"name": "adamw", "lr": 1e-12}}
    space = {"method.warmup_frac": {"low": 0.1, "high": 0.3}, "method.sigma_cutoff": {"low": 1e-7, "high": 1e-6, "log": True}}
    study = write_study(folder / "s.yaml", base=base, trials=2, objectives=["top1", "inter_node_bytes"], space=space,
                        references={"paper_defaults": False, "ddp": True})
    run_cli("study", "create", str(study), cwd=folder, env=env)
    run_cli("study", "run", "tiny", cwd=folder, env=env)
    return folder, env


def _shot(tmp_path: Path, name: str) -> Path:
    return Path(os.environ.get(SCREENSHOT_DIR_VARIABLE) or tmp_path) / name


def _text(dom: str) -> str:
    """The page's words: tags removed, white space collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


def test_mlflow_and_optuna_dashboard_show_the_study_and_its_answer(
        finished_study: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, env = finished_study
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{folder / 'optuna.db'}")
    answer = recommendation.current(study)
    assert answer is not None
    verdict = answer.lines()[0][:30]  # "recommended: trial N (top-1 ..." or "not recommended: ..."
    trials = {t.number: t for t in study.trials}
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    (parent,) = [r for r in runs.values() if r.data.tags.get("abtune.role") == "study"]
    chosen = runs[trials[answer.trial].user_attrs[RUN_ID_ATTR]]
    tagged = [r for r in runs.values() if r.data.tags.get("abtune.recommended") == "true"]
    assert tagged in ([], [chosen]), (answer.held, [r.info.run_name for r in tagged])
    within = bool(tagged)
    (ddp,) = [r for r in runs.values() if r.data.tags.get("abtune.reference") == "ddp"]

    process, addresses = _service_addresses(folder, env)
    profile = tmp_path / "chromium-profile"
    try:
        ui = addresses["MLflow"]
        pages = {
            # MLflow 3.17 opens an experiment linked without parameters (its own list) in its GenAI view,
            # whatever the experiment's kind (a screenshot, no assertion: docs/mlflow.md); abtune ui's link does not
            "mlflow-experiment-from-list.png": f"{ui}/#/experiments/{experiment.experiment_id}",
            "mlflow-experiment.png": links_printed(ui, experiment.experiment_id),
            "mlflow-study-run.png": f"{ui}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}",
            "mlflow-ddp-trial.png": f"{ui}/#/experiments/{experiment.experiment_id}/runs/{ddp.info.run_id}",
            **({"mlflow-recommended-trial.png": f"{ui}/#/experiments/{experiment.experiment_id}/runs/"
                                                f"{chosen.info.run_id}"} if within else {}),
        }
        trial_runs = [r.info.run_id for r in runs.values() if r.data.tags.get("abtune.role") == "trial"]
        pages["mlflow-compare-trials.png"] = (f"{ui}/#/compare-runs?runs={quote(json.dumps(trial_runs))}"
                                              f"&experiments={quote(json.dumps([experiment.experiment_id]))}")
        doms = {name: browser.render(url, _shot(tmp_path, name), profile) for name, url in pages.items()}
        dashboard = addresses["optuna-dashboard"]
        study_id = study._study_id
        for name, path in (("optuna-study.png", f"/dashboard/studies/{study_id}"),
                           ("optuna-note.png", f"/dashboard/studies/{study_id}/note"),  # the study's note: its own tab
                           ("optuna-trials.png", f"/dashboard/studies/{study_id}/trials")):
            doms[name] = browser.render(dashboard + path, _shot(tmp_path, name), profile)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
    print(f"screenshots: {_shot(tmp_path, '')}")
    text = {name: _text(dom) for name, dom in doms.items()}

    # the experiment opens in the model-training view: its runs, no GenAI traces
    experiment_page = text["mlflow-experiment.png"]
    assert not [marker for marker in GENAI_VIEW if marker in doms["mlflow-experiment.png"]], experiment_page[:3000]
    assert "tiny-study" in experiment_page and ddp.info.run_name in experiment_page, experiment_page[:3000]

    # the study's run: its description with the recommendation and its evidence, its progress as metrics
    study_page = text["mlflow-study-run.png"]
    assert "Study tiny" in study_page and "maximize top-1" in study_page, study_page[:3000]
    assert "Recommendation" in study_page and _text(verdict) in study_page, (verdict, study_page[:3000])
    assert ("held against DDP" if within else "closest to DDP") in study_page, study_page[:3000]

    # the reference and the recommended trials' runs are tagged so
    assert "abtune.reference" in text["mlflow-ddp-trial.png"] and "ddp" in text["mlflow-ddp-trial.png"]
    if within:
        assert "abtune.recommended" in text["mlflow-recommended-trial.png"], text["mlflow-recommended-trial.png"][:3000]

    # comparing the trials: the parallel-coordinates plot opens on searched parameters (tracking/view.py)
    axes = re.findall(r'class="axis-title"[^>]*>([^<]+)<', doms["mlflow-compare-trials.png"])
    assert axes[:len(space_of(study))] and all(axis.startswith("Search/") for axis in axes[:len(space_of(study))]), axes

    # optuna-dashboard: the recommendation in the study's note, traffic in MB, references named in their notes
    dashboard_text = text["optuna-study.png"] + " " + text["optuna-trials.png"]
    assert _text(verdict) in text["optuna-note.png"], (verdict, text["optuna-note.png"][-3000:])
    assert "inter_node_mb" in dashboard_text, dashboard_text[:3000]
    assert "DDP reference" in dashboard_text, dashboard_text[:3000]
    # beside the dashboard's own front (the stored objective: bytes), abtune's in MB (study/dashboard_front.py)
    assert "Pareto front: top-1 vs inter-node MB per rank" in text["optuna-study.png"], text["optuna-study.png"][:3000]


def _service_addresses(cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`abtune ui`, and the addresses it printed (service name -> URL)."""
    process, lines = browser.start_ui(cwd, env)
    found = [re.match(r"^([\w-]+): +(http://\S+)$", line.strip()) for line in lines]
    return process, {match.group(1): match.group(2) for match in found if match}


def space_of(study: optuna.Study) -> set[str]:
    return {key for trial in study.trials for key in trial.params}


def links_printed(ui: str, experiment_id: str) -> str:
    from abtune.tracking.view import experiment_url

    return experiment_url(ui, experiment_id)
