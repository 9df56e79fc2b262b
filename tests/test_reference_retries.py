"""Every comparison reads the reference trials: a failed reference run is retried whatever `retries.failed`
says, and a reference left failed by an earlier `study run` is enqueued again by the next one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from abtune.attrs import DDP, FAIL_REASON_ATTR, OVER_BUDGET_ATTR, REFERENCE_ATTR, RETRIED_ATTR, RETRY_OF_ATTR
from abtune.study import retries
from abtune.study.storage import open_storage
from abtune.training.hooks import TrainingHook
from tests.conftest import CliResult
from tests.study_cli import in_process
from tests.study_helpers import trials_of, write_study
from tests.test_tracking_outage import SHORT_BASE, SHORT_SPACE

pytestmark = pytest.mark.slow


def fail_once(run_dir: Path, once: str) -> TrainingHook:
    """A trial hook whose first run fails on rank 0 as it starts."""
    if not Path(once).exists():
        Path(once).touch()
        raise RuntimeError("rank 0 failed once")
    return TrainingHook()


Abtune = Callable[..., CliResult]


def _study(tmp_path: Path, abtune_main: Abtune, **fields: object) -> str:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=2, references={"paper_defaults": False, "ddp": True},
                        base=SHORT_BASE, space=SHORT_SPACE, layout={"nproc": 1}, **fields)
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)
    return url


def _run(tmp_path: Path, url: str, abtune_main: Abtune) -> str:
    result = in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path)
    return result.stdout + result.stderr


def test_a_failed_reference_run_is_retried_although_retries_failed_is_0(tmp_path: Path, abtune_main: Abtune) -> None:
    hook = {"factory": f"{__name__}:fail_once", "options": {"once": str(tmp_path / "failed")}}
    url = _study(tmp_path, abtune_main, hooks=[hook])
    _run(tmp_path, url, abtune_main)

    trials = trials_of(url)
    assert [(t.state, t.user_attrs.get(REFERENCE_ATTR), t.user_attrs.get(RETRY_OF_ATTR)) for t in trials] == [
        (TrialState.FAIL, DDP, None), (TrialState.COMPLETE, DDP, 0), (TrialState.COMPLETE, None, None)]
    assert trials[0].user_attrs[RETRIED_ATTR] and "rank 0 failed once" in trials[0].user_attrs[FAIL_REASON_ATTR]


def test_a_reference_left_failed_runs_again_at_the_next_study_run_once(tmp_path: Path, abtune_main: Abtune) -> None:
    url = _study(tmp_path, abtune_main)
    storage = open_storage(url)
    study = optuna.load_study(study_name="tiny", storage=storage)
    trial = study.ask()  # the DDP reference, failed by an earlier `study run` that did not retry it
    trial.set_user_attr(FAIL_REASON_ATTR, "the job exited with code 1")
    study.tell(trial, state=TrialState.FAIL)
    lost = retries.lost_references(study.trials)
    assert [t.number for t in lost] == [0]
    for _ in range(2):  # two workers that started at once both enqueue it
        retries.enqueue(study, lost[0], retries.FAILED)
    _run(tmp_path, url, abtune_main)

    trials = trials_of(url)
    assert [(t.state, t.user_attrs.get(REFERENCE_ATTR), t.user_attrs.get(RETRY_OF_ATTR)) for t in trials] == [
        (TrialState.FAIL, DDP, None), (TrialState.COMPLETE, DDP, 0), (TrialState.FAIL, DDP, 0),
        (TrialState.COMPLETE, None, None)]  # the budget of 2: the reference and one search trial
    assert trials[2].user_attrs[OVER_BUDGET_ATTR]
    assert retries.lost_references(trials) == []


def test_the_next_study_run_enqueues_a_lost_reference(tmp_path: Path, abtune_main: Abtune) -> None:
    url = _study(tmp_path, abtune_main)
    study = optuna.load_study(study_name="tiny", storage=open_storage(url))
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    output = _run(tmp_path, url, abtune_main)

    trials = trials_of(url)
    assert "trial 0 (DDP reference) failed: enqueued again" in output
    assert [(t.state, t.user_attrs.get(RETRY_OF_ATTR)) for t in trials] == [
        (TrialState.FAIL, None), (TrialState.COMPLETE, 0), (TrialState.COMPLETE, None)]
