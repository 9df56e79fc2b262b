"""pytest fixtures for a real PostgreSQL server (Debian's package, started by pg.sh on 127.0.0.1).

Use from any test module (outside tests/postgres, whose conftest.py already provides them):

    pytest_plugins = ["tests.postgres.fixture"]

    def test_many_workers(postgres_url: str) -> None:   # postgres+psycopg2://abtune:SECRET@127.0.0.1:PORT/abtune
        ...

Fixtures: `postgres_server` (session; a PostgresServer with .url(), .password, .port, .state_dir),
`postgres_url` (session; the shared database `abtune`, so use unique study names) and
`postgres_db_url` (per test; a fresh empty database, dropped afterwards).
One server per pytest session, in a new /tmp/abtune-pg-* (removed afterwards). With
ABTUNE_PG_STATE_DIR=DIR it uses (or starts) the server in DIR and leaves it running.
Where PostgreSQL cannot run (not installed and not root to install it) the tests skip, except with
CI=true, where they fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import system
from tests.postgres import server
from tests.postgres.server import PostgresServer


def _unavailable(reason: str) -> None:
    system.unavailable("PostgreSQL", reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reuse = os.environ.get("ABTUNE_PG_STATE_DIR")
    if not server.installed() and os.geteuid() != 0:
        _unavailable("no /usr/lib/postgresql/*/bin/postgres, and installing it (apt-get) needs root")
    # Not pytest's tmp_path: its /tmp/pytest-of-root parent is mode 0700, which `postgres` cannot traverse.
    state_dir = Path(reuse).resolve() if reuse else Path(tempfile.mkdtemp(prefix="abtune-pg-", dir="/tmp"))
    try:
        pg = server.up(state_dir)
    except server.PgShError as exc:
        if not reuse:
            with contextlib.suppress(server.PgShError):
                server.down(state_dir)
        if not server.installed():
            _unavailable(str(exc))
        pytest.fail(str(exc), pytrace=False)
    try:
        yield pg
    finally:
        if not reuse:
            server.down(state_dir)
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """postgresql+psycopg2://abtune:SECRET@127.0.0.1:PORT/abtune, shared by the whole session."""
    return postgres_server.url()


@pytest.fixture
def postgres_db_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database owned by `abtune` for one test; dropped (with its connections) afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_server.url(), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres_server.url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
