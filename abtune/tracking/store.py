"""A SQL database as MLflow's store, looked at once before MLflow opens it (`abtune train`, the study
runner, `abtune ui`'s server).

MLflow and Optuna both keep their schema version in a table named `alembic_version`. On a database
Optuna set up first, MLflow writes its own tables beside Optuna's and then stops on Optuna's revision
("Can't locate revision"); the other way round Optuna refuses. So each needs a database of its own,
and a database that has a schema revision but none of MLflow's tables is refused before MLflow writes.
"""

from __future__ import annotations

import re
from pathlib import Path

from abtune.errors import ConfigError
from abtune.redact import redact

SQL_SERVERS = ("postgresql", "mysql", "mssql")  # MLflow's SQL stores other than SQLite
SCHEMA_VERSION_TABLE = "alembic_version"
MLFLOW_TABLE = "experiments"  # among the first tables MLflow creates, before it records its schema revision
REFUSED_REVISION = re.compile(r"Can't locate revision identified by '([^']*)'")


def check_database(uri: str) -> None:
    """Connect once (MLflow retries a server it cannot reach for about 100 s) and refuse another program's
    database in one line; a connection's own error propagates for the caller to word."""
    if not _is_sql_store(uri):
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
            if SCHEMA_VERSION_TABLE in tables and MLFLOW_TABLE not in tables:
                revision = connection.execute(sqlalchemy.text(f"SELECT version_num FROM {SCHEMA_VERSION_TABLE}"))
                raise another_programs_database(uri, revision.scalar())
    finally:
        engine.dispose()


def another_programs_database(uri: str, revision: str | None) -> ConfigError:
    return ConfigError(f"MLflow cannot use the database {redact(uri)}: another program set it up first (schema "
                       f"revision {revision}, not MLflow's; Optuna's when the study shares the database); give MLflow "
                       "a database of its own (e.g. CREATE DATABASE mlflow) and pass its URL as --tracking-uri")


def refused_revision(uri: str, message: str) -> ConfigError | None:
    """MLflow's own error on a database whose schema revision it does not know (one where an earlier MLflow
    already wrote its tables beside Optuna's), as the one line check_database gives."""
    found = REFUSED_REVISION.search(message)
    return another_programs_database(uri, found.group(1)) if found else None


def _is_sql_store(uri: str) -> bool:
    if uri.startswith("sqlite:///"):  # an existing file: a new one is MLflow's to create
        return Path(uri.removeprefix("sqlite:///")).is_file()
    return uri.startswith(SQL_SERVERS)
