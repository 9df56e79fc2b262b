"""Where studies live: a storage URL -> an Optuna storage, with secrets kept out of every message.

- `sqlite:///optuna.db` (the default, in the working directory): zero set-up, one machine.
- any SQLAlchemy RDB URL, e.g. `postgresql://user:password@host/db` (psycopg2 or psycopg 3, whichever is
  installed: `abtune.databases`): many workers, many hosts.
- `journal:PATH`: Optuna's JournalStorage on a file, for shared file systems without a database.

Relative paths are made absolute once, so trial processes started elsewhere find the same file.
The URL chosen is: `--storage`, else `$ABTUNE_STORAGE`, else the study file's `storage:`, else the
default. The same variable is the one way a trial's processes (the pruning hook) and launched study
workers learn their study's storage: the runner sets it for the processes it starts, so the URL (which
may hold a password) is never written to a file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalStorage

from abtune.databases import check_url_shape, missing_driver, with_installed_driver
from abtune.errors import ConfigError
from abtune.redact import redact

DEFAULT_STORAGE = "sqlite:///optuna.db"
STORAGE_VARIABLE = "ABTUNE_STORAGE"
JOURNAL_PREFIX = "journal:"
SQLITE_PREFIX = "sqlite:///"
SQLITE_TIMEOUT_S = 60  # several trial processes report into one SQLite file
# Processes opening a fresh database at once race to create Optuna's tables and version row: the losers
# see the winners' work as an error, and succeed when they open it again.
SCHEMA_RACE_MARKERS = ("already exists", "UNIQUE constraint failed: alembic_version", "duplicate key value")
SCHEMA_RACE_ATTEMPTS = 5
CORRUPT_SQLITE_MARKERS = ("file is not a database", "database disk image is malformed")


def resolve_storage_url(flag: str | None, from_study_file: str | None = None) -> str:
    return flag or os.environ.get(STORAGE_VARIABLE) or from_study_file or DEFAULT_STORAGE


def storage_environment(url: str) -> dict[str, str]:
    """What the processes a runner starts (trial ranks, study workers) get to find the study's storage."""
    return {STORAGE_VARIABLE: absolute_url(url)}


def url_from_environment(needed_by: str) -> str:
    """The storage a runner gave this process (`storage_environment`); a one-line error when there is none."""
    url = os.environ.get(STORAGE_VARIABLE)
    if not url:
        raise ConfigError(f"{needed_by} needs {STORAGE_VARIABLE}, which `abtune study run` and `study launch` set "
                          "for the processes they start")
    return url


def absolute_url(url: str) -> str:
    """The same storage, with a relative file path made absolute (against the working directory)."""
    if url.startswith(JOURNAL_PREFIX):
        return JOURNAL_PREFIX + str(Path(url.removeprefix(JOURNAL_PREFIX)).expanduser().resolve())
    if url.startswith(SQLITE_PREFIX) and ":memory:" not in url:
        return SQLITE_PREFIX + str(Path(url.removeprefix(SQLITE_PREFIX)).expanduser().resolve())
    return url


def storage_file(url: str) -> Path | None:
    """The file behind a SQLite or journal URL, None for a database server."""
    url = absolute_url(url)
    for prefix in (JOURNAL_PREFIX, SQLITE_PREFIX):
        if url.startswith(prefix) and ":memory:" not in url:
            return Path(url.removeprefix(prefix))
    return None


def open_storage(url: str, create: bool = False) -> BaseStorage:
    """An Optuna storage; ConfigError (one line, password masked) when it cannot be reached.

    `create=False` refuses to create a missing SQLite or journal file: commands that read a study
    should not leave an empty database behind a typo.
    """
    url = absolute_url(url)
    check_storage_url(url)
    path = storage_file(url)
    if path is not None and not path.parent.is_dir():
        raise ConfigError(f"storage {redact(url)} is unreachable: folder {path.parent} does not exist")
    if path is not None and not create and not path.exists():
        raise ConfigError(
            f"no studies at {redact(url)} (no such file); create one with `abtune study create STUDY.yaml`"
            " or pass --storage / set ABTUNE_STORAGE"
        )
    if url.startswith(JOURNAL_PREFIX):
        return _opened(url, lambda: JournalStorage(JournalFileBackend(str(path))), retry=False)
    # A server's pool keeps one idle connection (SQLAlchemy keeps up to five; Optuna's start-up alone
    # left two open): every worker and trial rank holds its own.
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else {"pool_size": 1}
    engine_url = with_installed_driver(url)
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            return _opened(url, lambda: _rdb_storage(engine_url, kwargs))
        except _SchemaRace:  # another process created the tables between Optuna's check and its CREATE
            time.sleep(0.05 * (attempt + 1))
    return _opened(url, lambda: _rdb_storage(engine_url, kwargs), retry=False)


class _SchemaRace(Exception):
    pass


_SCHEMA_HEAD: list[str] = []  # the installed Optuna's newest schema revision, once read


def _rdb_storage(engine_url: str, engine_kwargs: dict[str, Any]) -> RDBStorage:
    """Optuna's RDB storage, its schema checked against the installed Optuna's head revision as Optuna checks
    it, but with the head read once per process: Optuna reads it from its ten migration scripts (SQLAlchemy
    models each) at every open, a third of a second of CPU, and a study runner or a command opens several."""
    storage = RDBStorage(engine_url, engine_kwargs=engine_kwargs, skip_compatibility_check=True)
    if not _SCHEMA_HEAD:
        _SCHEMA_HEAD.append(storage.get_head_version())
    if storage.get_current_version() != _SCHEMA_HEAD[0]:  # Optuna's own check, for its message
        storage = RDBStorage(engine_url, engine_kwargs=engine_kwargs)
    return storage


def _opened(url: str, opener: Callable[[], BaseStorage], retry: bool = True) -> BaseStorage:
    """`opener()`, its failures as one line (password masked) that names the cause."""
    try:
        return opener()
    except ImportError as error:  # Optuna's "Failed to import DB access module", from the driver's
        raise missing_driver(url, error) from None
    except Exception as error:  # SQLAlchemy, drivers and Optuna raise many kinds; all mean "cannot use it"
        text = str(error)
        if retry and any(marker in text for marker in SCHEMA_RACE_MARKERS):
            raise _SchemaRace from error
        if url.startswith(SQLITE_PREFIX) and any(marker in text for marker in CORRUPT_SQLITE_MARKERS):
            raise ConfigError(f"storage {redact(url)} is corrupt, not a SQLite database Optuna can read "
                              f"({_first_line(error)}); move the file aside and create the study again, or pass "
                              "--storage") from None
        raise ConfigError(f"storage {redact(url)} is unreachable: {_first_line(error)}") from None


def check_storage_url(url: str) -> None:
    """A ConfigError naming the expected shapes for a URL no storage can be opened from (password masked)."""
    check_url_shape(url, "storage")
    if not url.startswith(JOURNAL_PREFIX) and "://" not in url:
        raise ConfigError(f"storage {redact(url)} is not a storage URL: write {SQLITE_PREFIX}FILE, "
                          f"{JOURNAL_PREFIX}FILE or a database URL (postgresql://, mysql://)")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return redact(text[0] if text else type(error).__name__)


def study_names(storage: BaseStorage) -> list[str]:
    return sorted(s.study_name for s in storage.get_all_studies())


def require_study(storage: BaseStorage, name: str, url: str) -> int:
    """The study's id, or a ConfigError listing the studies that do exist."""
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        known = study_names(storage)
        hint = f"studies there: {', '.join(known)}" if known else "it holds no study yet"
        raise ConfigError(f"no study named {name!r} in {redact(absolute_url(url))}; {hint}") from None


def quiet_optuna() -> None:
    """abtune prints its own progress; Optuna's per-trial INFO lines and experimental warnings are noise."""
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
