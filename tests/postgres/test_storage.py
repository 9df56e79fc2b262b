"""The storages of `abtune study` under real concurrency: 4 processes optimizing one study at once
against PostgreSQL, a journal file and SQLite, and what failure looks like (locked SQLite,
unreachable PostgreSQL)."""

from __future__ import annotations

import collections
import socket
import sqlite3
import threading
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from abtune.redact import redact
from tests.postgres import workers
from tests.postgres.server import PostgresServer

pytestmark = pytest.mark.slow

WORKERS = 4
TRIALS_PER_WORKER = 10


def one_line(exc: BaseException) -> str:
    """The driver's own message (psycopg2/sqlite3 under SQLAlchemy's wrapper), first line, password masked."""
    while getattr(exc, "orig", None) is None and exc.__cause__ is not None:
        exc = exc.__cause__
    orig = getattr(exc, "orig", None) or exc
    return redact((str(orig).strip().splitlines() or [type(orig).__name__])[0])


def run_four_workers(spec: workers.StorageSpec) -> list[optuna.trial.FrozenTrial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="concurrent", storage=workers.make_storage(spec))
    results, _ = workers.run_workers(workers.optimize, spec, "concurrent", WORKERS, TRIALS_PER_WORKER)
    assert [r.get("error") for r in results] == [None] * WORKERS, [r.get("traceback") for r in results]
    return optuna.load_study(study_name="concurrent", storage=workers.make_storage(spec)).get_trials()


def assert_no_trial_lost(trials: list[optuna.trial.FrozenTrial]) -> None:
    total = WORKERS * TRIALS_PER_WORKER
    assert len(trials) == total
    assert collections.Counter(t.state for t in trials) == {optuna.trial.TrialState.COMPLETE: total}
    assert sorted(t.number for t in trials) == list(range(total))  # unique and contiguous
    assert len({t._trial_id for t in trials}) == total
    assert collections.Counter(t.user_attrs["worker"] for t in trials) == {w: TRIALS_PER_WORKER for w in range(WORKERS)}
    assert all(t.value == t.params["x"] ** 2 for t in trials)


# ---------------------------------------------------------------- the fixture itself

def test_server_listens_on_loopback_only_and_checks_the_password(postgres_server: PostgresServer) -> None:
    with sa.create_engine(postgres_server.url(), poolclass=sa.pool.NullPool).connect() as conn:
        row = conn.execute(sa.text(
            "SELECT current_user, current_database(), inet_server_addr()::text, inet_server_port(),"
            " current_setting('listen_addresses')")).one()
    assert tuple(row) == ("abtune", "abtune", "127.0.0.1/32", postgres_server.port, "127.0.0.1")
    assert (postgres_server.state_dir / "run" / f".s.PGSQL.{postgres_server.port}").is_socket()

    wrong = postgres_server.url().replace(postgres_server.password, "not-the-password")
    with pytest.raises(sa.exc.OperationalError) as info:
        sa.create_engine(wrong, poolclass=sa.pool.NullPool).connect()
    assert one_line(info.value) == (f'connection to server at "127.0.0.1", port {postgres_server.port} failed: '
                                    'FATAL:  password authentication failed for user "abtune"')


def test_password_is_masked_and_never_logged(postgres_server: PostgresServer) -> None:
    url = postgres_server.url()
    assert postgres_server.password in url
    assert redact(url) == f"postgresql+psycopg2://abtune:***@127.0.0.1:{postgres_server.port}/abtune"
    assert postgres_server.password not in repr(postgres_server)
    logs = [p for p in postgres_server.state_dir.iterdir() if p.suffix == ".log"]
    assert {p.name for p in logs} >= {"pg-sh.log", "postgresql.log", "initdb.log"}
    for log in logs:
        assert postgres_server.password not in log.read_text(errors="replace"), log
    assert "abtune:***@127.0.0.1" in (postgres_server.state_dir / "pg-sh.log").read_text()


# ---------------------------------------------------------------- 4 workers, one study

def test_postgres_four_workers_lose_no_trial(postgres_db_url: str) -> None:
    assert_no_trial_lost(run_four_workers(("rdb", postgres_db_url)))


def test_journal_file_four_workers_lose_no_trial(tmp_path: Path) -> None:
    assert_no_trial_lost(run_four_workers(("journal", str(tmp_path / "journal.log"))))


def test_sqlite_four_workers_lose_no_trial_within_the_busy_timeout(tmp_path: Path) -> None:
    # Passes because each SQLite write lock is held for milliseconds and sqlite3 waits up to 5 s for
    # it; SQLite serializes every writer on one file lock (and fsyncs each commit), so it is slow
    # with many workers and fails as soon as a lock is held past the busy timeout (next test).
    assert_no_trial_lost(run_four_workers(("rdb", f"sqlite:///{tmp_path / 'study.db'}")))


def test_sqlite_locked_past_the_busy_timeout_fails_the_worker(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    spec = ("rdb", f"sqlite:///{path}")
    optuna.create_study(study_name="locked", storage=workers.make_storage(spec))
    study = optuna.load_study(study_name="locked", storage=workers.make_storage(spec, sqlite_timeout_s=0.2))

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock, e.g. a slow fsync on NFS
    try:
        with pytest.raises(optuna.exceptions.StorageInternalError) as info:
            study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # Optuna's own message blames "invalid data ... exceeding max length"; the cause says what happened.
    assert one_line(info.value) == "database is locked"
    assert study.get_trials() == []  # nothing half-written: the trial was never created

    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE]


# ---------------------------------------------------------------- unreachable PostgreSQL

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_postgres_refused_fails_at_once_with_one_line() -> None:
    port = _free_port()  # nothing listens there any more
    url = f"postgresql+psycopg2://abtune:hunter2@127.0.0.1:{port}/abtune"
    with pytest.raises(sa.exc.OperationalError) as info:
        workers.make_storage(("rdb", url))
    line = one_line(info.value)
    assert line.startswith(f'connection to server at "127.0.0.1", port {port} failed: Connection refused')
    assert "hunter2" not in str(info.value)


def test_unanswering_postgres_fails_after_the_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # A server that accepts TCP (the kernel completes the handshake) but never speaks: without
    # connect_timeout libpq would wait forever. The listener is closed after 60 s as a safety net,
    # which would turn a hang into a different error and fail the assert below.
    monkeypatch.setattr(workers, "CONNECT_TIMEOUT_S", 2)
    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
    port = listener.getsockname()[1]
    safety = threading.Timer(60, listener.close)
    safety.start()
    try:
        with pytest.raises(sa.exc.OperationalError) as info:
            workers.make_storage(("rdb", f"postgresql+psycopg2://abtune:hunter2@127.0.0.1:{port}/abtune"))
    finally:
        safety.cancel()
        listener.close()
    assert one_line(info.value) == f'connection to server at "127.0.0.1", port {port} failed: timeout expired'
    assert "hunter2" not in str(info.value)
