"""Four `abtune study run` workers on one study in a real PostgreSQL server lose no trial.

The server comes from the PostgreSQL fixture of tests/postgres (`postgres_db_url`, a fresh
database per test) when that plugin is present, else from $ABTUNE_TEST_POSTGRES_URL; without
either the test skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from abtune.study import results
from abtune.study.attrs import OVER_BUDGET_ATTR
from tests.study_helpers import start_run, trials_of, write_study

if (Path(__file__).parent / "postgres" / "fixture.py").exists():
    pytest_plugins = ["tests.postgres.fixture"]

pytestmark = pytest.mark.slow
WORKERS = 4
BUDGET = 6


@pytest.fixture
def postgres_study_url(request: pytest.FixtureRequest) -> str:
    if os.environ.get("ABTUNE_TEST_POSTGRES_URL"):
        return os.environ["ABTUNE_TEST_POSTGRES_URL"]
    try:
        return str(request.getfixturevalue("postgres_db_url"))
    except pytest.FixtureLookupError:
        pytest.skip("no PostgreSQL: needs the tests/postgres fixture or ABTUNE_TEST_POSTGRES_URL")


def test_four_workers_on_postgresql_lose_no_trial(tmp_path: Path, postgres_study_url: str) -> None:
    from tests.conftest import run_cli

    url, name = postgres_study_url, f"pg4-{os.getpid()}"  # a shared database may hold earlier runs
    study = write_study(tmp_path / "s.yaml", name=name, trials=BUDGET)
    run_cli("study", "create", str(study), "--storage", url, cwd=tmp_path)
    workers = [start_run(tmp_path, name, "--storage", url, "--no-tracking") for _ in range(WORKERS)]
    password = make_url(url).password
    for worker in workers:
        out, err = worker.communicate(timeout=900)
        assert worker.returncode == 0, err
        assert not password or password not in out + err

    trials = trials_of(url, name)
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL}
    assert [t.number for t in trials] == list(range(len(trials)))
    # A worker that asked as others took the last of the budget steps back: that trial is FAIL, never
    # run, and not counted (runner._over_budget). Every other trial ran to its summary; workers that
    # ask at the same instant may each overshoot by one.
    skipped = [t for t in trials if t.user_attrs.get(OVER_BUDGET_ATTR)]
    ran = [t for t in trials if t not in skipped]
    assert all(t.state == TrialState.FAIL and "run_dir" not in t.user_attrs for t in skipped)
    assert all((Path(t.user_attrs["run_dir"]) / "summary.json").exists() for t in ran)
    assert BUDGET <= results.finished_count(trials) == len(ran) <= BUDGET + WORKERS - 1
    owners = {t.system_attrs["abtune:worker"]["pid"] for t in ran}  # a skipped trial never had an owner
    assert len(owners) > 1  # the workers shared the study
