"""Four `abtune study run` workers on one study in a real PostgreSQL server lose no trial, and workers
that start together draw parameters of their own (on SQLite too).

The server comes from the PostgreSQL fixture of tests/postgres (`postgres_db_url`, a fresh
database per test) when that plugin is present, else from $ABTUNE_TEST_POSTGRES_URL; without
either the test skips.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from optuna.study import StudyDirection
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from abtune.attrs import OVER_BUDGET_ATTR, WORKER_ATTR
from abtune.study import results
from abtune.study.storage import open_storage
from abtune.tracking import open_tracking
from tests.conftest import CliResult
from tests.study_helpers import TINY_BASE, draw, start_run, trials_of, write_study

if (Path(__file__).parent / "postgres" / "fixture.py").exists():
    pytest_plugins = ["tests.postgres.fixture"]

pytestmark = pytest.mark.slow
WORKERS = 4
BUDGET = 6
# What is checked is who ran which trial, not what it learned: a few steps a trial (the storage's traffic per
# trial is the same: its start, one evaluation and its end).
SHORT_TRIALS = {**TINY_BASE, "train": {**TINY_BASE["train"], "steps": 4, "eval_every": 4, "log_every": 2}}


@pytest.fixture
def postgres_study_url(request: pytest.FixtureRequest) -> str:
    if os.environ.get("ABTUNE_TEST_POSTGRES_URL"):
        return os.environ["ABTUNE_TEST_POSTGRES_URL"]
    try:
        return str(request.getfixturevalue("postgres_db_url"))
    except pytest.FixtureLookupError:
        pytest.skip("no PostgreSQL: needs the tests/postgres fixture or ABTUNE_TEST_POSTGRES_URL")


def as_in_the_readme(url: str) -> str:
    """`postgresql://user:password@host:port/db`, the form docs/studies.md shows: no driver named."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_four_workers_on_postgresql_lose_no_trial(tmp_path: Path, postgres_study_url: str,
                                                  abtune_main: Callable[..., CliResult]) -> None:
    url, name = as_in_the_readme(postgres_study_url), f"pg4-{os.getpid()}"  # a shared database may hold earlier runs
    study = write_study(tmp_path / "s.yaml", name=name, trials=BUDGET, base=SHORT_TRIALS)
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
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
    owners = {t.system_attrs[WORKER_ATTR]["pid"] for t in ran}  # a skipped trial never had an owner
    assert len(owners) > 1  # the workers shared the study


@pytest.fixture
def fresh_database_url(request: pytest.FixtureRequest) -> str:
    """A database of its own (tests/postgres's per-test one): connections to it are this test's alone."""
    try:
        return str(request.getfixturevalue("postgres_db_url"))
    except pytest.FixtureLookupError:
        pytest.skip("no PostgreSQL: needs the tests/postgres fixture")


def held_connections(url: str) -> int:
    """Connections to the database of `url`, other than the one asking (PostgreSQL's own view)."""
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one())


# 16 workers and their trials' ranks held about 3.5 connections a process and exhausted a 60-connection
# server (BENCHMARKS, issue 25): each store keeps one idle connection per process, not its pool's start-up two.
def test_a_study_storage_keeps_one_connection_per_process(fresh_database_url: str) -> None:
    storage = open_storage(fresh_database_url, create=True)
    study_id = storage.create_new_study([StudyDirection.MAXIMIZE], f"conn-{os.getpid()}")
    trial_id = storage.create_new_trial(study_id)
    storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
    assert len(storage.get_all_trials(study_id)) == 1
    assert held_connections(fresh_database_url) == 1


def test_an_mlflow_sql_store_keeps_one_connection_per_process(fresh_database_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", raising=False)  # set by the tracking, restored after
    tracking = open_tracking(as_in_the_readme(fresh_database_url))
    run_id = tracking.client.create_run(tracking._experiment_id("connections")).info.run_id
    tracking.log_metrics(run_id, {"top1": 0.5})
    assert held_connections(fresh_database_url) == 1


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names())


def test_mlflow_on_the_database_optuna_set_up_ends_in_one_line_that_asks_for_a_database_of_its_own(
        tmp_path: Path, fresh_database_url: str, abtune_main: Callable[..., CliResult]) -> None:
    """Both keep their schema version in `alembic_version`: MLflow stops on Optuna's revision ("Can't locate
    revision") after writing its tables beside Optuna's. abtune refuses first, for a run and for the UI; a database
    where an earlier MLflow already wrote its tables gets the same line (in this process: a new Python costs seconds
    of imports; the installed command's one-line errors have their tests in test_ui.py and test_cli_errors.py)."""
    from mlflow import MlflowClient

    from tests.conftest import write_config

    url, password = as_in_the_readme(fresh_database_url), make_url(fresh_database_url).password
    open_storage(url, create=True).create_new_study([StudyDirection.MAXIMIZE], "shared")  # what study create does
    optunas = _tables(fresh_database_url)
    config = write_config(tmp_path / "run.yaml")
    expected = (f"abtune: error: MLflow cannot use the database postgresql+psycopg2://{make_url(url).username}:***@"
                f"{make_url(url).host}:{make_url(url).port}/{make_url(url).database}: another program set it up first "
                "(schema revision ")

    def refused(*args: str) -> None:
        result = abtune_main(*args, "--tracking-uri", url, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(expected), result.stderr
        assert "give MLflow a database of its own" in result.stderr and password not in result.stdout + result.stderr

    refused("train", str(config), "--run-dir", str(tmp_path / "run"))
    refused("ui")
    assert _tables(fresh_database_url) == optunas  # MLflow wrote nothing there
    assert not (tmp_path / "run").exists()

    with pytest.raises(Exception, match="Can't locate revision"):  # as an earlier abtune (or MLflow itself) left it
        MlflowClient(fresh_database_url).search_experiments()
    assert "experiments" in _tables(fresh_database_url)
    refused("train", str(config), "--run-dir", str(tmp_path / "run"))
    refused("ui")


NO_REFERENCES = {"paper_defaults": False, "ddp": False}  # every trial sampled
AT_ONCE = 3


@pytest.fixture(scope="module")
def drawing_workers() -> Iterator[tuple[ProcessPoolExecutor, Any]]:
    """AT_ONCE worker processes and a barrier's manager, for every storage here: each new Python imports the
    study runner (seconds of CPU), so they are started once. A barrier of AT_ONCE holds each worker until all
    have read the storage, so the AT_ONCE draws of a round run in AT_ONCE processes of their own."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(AT_ONCE, mp_context=context) as pool:
        yield pool, manager


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
def test_workers_released_at_the_same_instant_draw_parameters_of_their_own(
        tmp_path: Path, storage: str, request: pytest.FixtureRequest, abtune_main: Callable[..., CliResult],
        drawing_workers: tuple[ProcessPoolExecutor, Any]) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db" if storage == "sqlite" else \
        as_in_the_readme(str(request.getfixturevalue("fresh_database_url")))
    study = write_study(tmp_path / "s.yaml", references=NO_REFERENCES)
    assert abtune_main("study", "create", str(study), "--storage", url).returncode == 0
    pool, manager = drawing_workers
    barrier = manager.Barrier(AT_ONCE)
    futures = [pool.submit(draw, url, 1, barrier) for _ in range(AT_ONCE)]
    draws = [future.result(timeout=600)[0] for future in futures]
    assert len({tuple(sorted(d.items())) for d in draws}) == AT_ONCE, draws


def test_a_lone_worker_draws_the_same_parameters_every_time_and_a_restarted_one_new_ones(
        tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    study = write_study(tmp_path / "s.yaml", references=NO_REFERENCES)
    first, second = (f"sqlite:///{tmp_path}/{name}.db" for name in ("first", "second"))
    for url in (first, second):
        assert abtune_main("study", "create", str(study), "--storage", url).returncode == 0
    drawn = draw(first, 3)
    assert draw(second, 3) == drawn  # the study's seed, whoever runs it
    assert len({tuple(sorted(d.items())) for d in drawn}) == 3
    assert draw(first, 1)[0] not in drawn  # a worker started later does not replay the first one's draws
