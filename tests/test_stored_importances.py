"""The importances a study's runner computed (40 forests: seconds of CPU) are stored in the study with a digest of
the trials they came from; `study best` prints them without computing them again while the search trials are the
same, and computes them afresh when a search trial changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from abtune.attrs import ANALYSIS_ATTR
from abtune.study import importance
from abtune.study.runner import StudyRunner
from abtune.study.storage import open_storage
from abtune.tracking import open_tracking
from tests.quickstart_fixture import SPACE, quickstart_study, quickstart_trials

OBJECTIVES = ["top1", "inter_node_bytes"]


def _never(*args: Any) -> dict[str, Any]:
    raise AssertionError("importances computed again for the same trials")


def _stored(url: str) -> dict[str, Any] | None:
    storage = open_storage(url)
    return storage.get_study_system_attrs(storage.get_study_id_from_name("quickstart")).get(ANALYSIS_ATTR)


def test_study_best_prints_the_importances_the_runner_stored(tmp_path: Path, mlflow_db: Path,
                                                             monkeypatch: pytest.MonkeyPatch, abtune_main: Any,
                                                             plots_not_drawn: None) -> None:
    url = quickstart_study(tmp_path)
    assert _stored(url) is None
    runner = StudyRunner(open_storage(url), "quickstart", url, 1, None, tracking=open_tracking(f"sqlite:///{mlflow_db}"))
    assert runner.run()  # the budget is spent: it rebuilds the study's plots and publishes its answer, nothing more
    held = _stored(url)
    assert held is not None
    assert held["analysis"] == importance.analysis(quickstart_trials(), list(SPACE), OBJECTIVES)
    assert held["analysis"]["p_values"]  # the full analysis: importances and their shuffled baseline

    computed = abtune_main("study", "best", "quickstart", "--storage", url, cwd=tmp_path)
    monkeypatch.setattr(importance, "analysis", _never)
    shown = abtune_main("study", "best", "quickstart", "--storage", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == computed.stdout
    assert "parameter importances (Optuna's default evaluator" in shown.stdout


def test_the_stored_analysis_serves_while_the_search_trials_stay_the_same(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    url = quickstart_study(tmp_path)
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name("quickstart")
    study = optuna.load_study(study_name="quickstart", storage=storage)

    def analysed(keep: bool = False) -> dict[str, Any]:
        return importance.study_analysis(storage, study_id, study.get_trials(), list(SPACE), OBJECTIVES, keep=keep)

    first = analysed()
    assert _stored(url) is None  # a reader (study best) stores nothing
    assert analysed(keep=True) == first
    assert _stored(url) == {"inputs": _stored(url)["inputs"], "analysis": first}  # type: ignore[index]

    monkeypatch.setattr(importance, "analysis", _never)
    study.add_trial(create_trial(state=TrialState.FAIL))  # no search trial changed: the stored one serves
    study.add_trial(create_trial(values=[0.95, 1.4e8], user_attrs={"top1": 0.95, "inter_node_bytes": 1.4e8,
                                                                     "reference": "ddp"}))
    assert analysed() == first

    fresh = {"importances": None, "importances_missing": "recomputed"}
    monkeypatch.setattr(importance, "analysis", lambda *args: fresh)
    trial = quickstart_trials()[2]
    trial.user_attrs["top1"] = 0.5  # a new search trial: computed again
    study.add_trial(trial)
    assert analysed(keep=True) == fresh
    assert _stored(url)["analysis"] == fresh  # type: ignore[index]
