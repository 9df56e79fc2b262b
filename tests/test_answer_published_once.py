"""A study's answer is published once per rebuild of its plots, the last one when `study run` ends, and not
again by a worker whose trials a later rebuild has read: the parent run's recommendation tags and description,
the recommended trial's run tag and optuna-dashboard's note are written by one path (recommendation.publish),
counted here in a real MLflow store."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna_dashboard
import pytest
from mlflow import MlflowClient

from abtune.attrs import ARTIFACTS_AT_ATTR
from abtune.study import importance
from abtune.study import runner as runner_module
from abtune.study.runner import StudyRunner
from abtune.study.storage import open_storage
from abtune.tracking import Tracking, open_tracking
from abtune.tracking._base import RECOMMENDED_TAG
from abtune.tracking._mlflow import NOTE_TAG
from tests.quickstart_fixture import quickstart_study
from tests.test_published_recommendation import _even_importances, _ran_study, _tagged


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """What is written meanwhile: `note` (a run's description), `recommended` (a run tagged as the study's
    choice), `search` (runs searched for the earlier choice) and `dashboard` (optuna-dashboard's note)."""
    counts: Counter[str] = Counter()

    def counted(owner: Any, name: str, kind: Callable[..., str | None]) -> None:
        method = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if (found := kind(*args, **kwargs)) is not None:
                counts[found] += 1
            return method(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    tags = {NOTE_TAG: "note", RECOMMENDED_TAG: "recommended"}
    counted(MlflowClient, "set_tag", lambda client, run_id, key, *rest, **kw: tags.get(key))
    counted(MlflowClient, "search_runs",
            lambda client, *args, **kw: "search" if RECOMMENDED_TAG in str(kw.get("filter_string")) else None)
    counted(optuna_dashboard, "save_note", lambda *args, **kw: "dashboard")
    return counts


def test_a_study_run_and_each_rebuild_publish_the_answer_once(tmp_path: Path, mlflow_db: Path, writes: Counter[str],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               plots_not_drawn: None) -> None:
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(importance, "_importances_of", _even_importances)  # what is published, not its numbers: 40 fits
    runner, runs = _ran_study(tmp_path, 0.95, uri)  # the budget spent: the run rebuilds the plots once and ends
    assert _tagged(uri, runs) == [2]
    # descriptions: the study's when the runner starts, then the rebuild's (the study's text with the new plots)
    # and the answer's; the choice tagged, and the dashboard's note written, once
    assert writes == {"note": 3, "recommended": 1, "search": 1, "dashboard": 1}, writes

    monkeypatch.setattr(runner_module, "claim_study_artifacts", lambda *args, **kwargs: True)
    writes.clear()
    runner._update_study_artifacts()  # a rebuild while the study runs
    assert writes == {"note": 2, "recommended": 1, "search": 1, "dashboard": 1}, writes
    assert _tagged(uri, runs) == [2]
    note = MlflowClient(uri).get_run(runner.parent_run).data.tags[NOTE_TAG]
    assert note.index("## Recommendation") < note.index("![pareto_front]"), note


def test_a_worker_whose_last_rebuild_another_worker_made_publishes_nothing_more(
        tmp_path: Path, mlflow_db: Path, writes: Counter[str]) -> None:
    """Another worker claimed the study's rebuild after this one's last trial ended (here: it ran none): that
    rebuild reads every trial this worker finished and publishes the answer."""
    url = quickstart_study(tmp_path)
    storage = open_storage(url)
    storage.set_study_system_attr(storage.get_study_id_from_name("quickstart"), ARTIFACTS_AT_ATTR, time.time())
    runner = StudyRunner(storage, "quickstart", url, 1, None, tracking=open_tracking(f"sqlite:///{mlflow_db}"))
    assert runner.run()
    assert writes == {"note": 1}, writes  # the study's description when the runner started, nothing after


def test_without_tracking_the_dashboard_still_gets_the_answer_once(tmp_path: Path, writes: Counter[str]) -> None:
    url = quickstart_study(tmp_path)
    runner = StudyRunner(open_storage(url), "quickstart", url, 1, None, tracking=Tracking())
    assert runner.run()
    assert writes == {"dashboard": 1}, writes
