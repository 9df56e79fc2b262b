"""Database URLs as people write them: `postgresql://user:password@host/db` opens with the PostgreSQL
driver that is installed.

SQLAlchemy maps a URL that names no driver to a driver of its own choosing (psycopg2 up to SQLAlchemy
2.0, psycopg 3 from 2.1), so the same URL failed wherever the other one was installed: Optuna said
"Failed to import DB access module", which reads like an unreachable server, and MLflow raised a
traceback. The study storage and the MLflow store both open their URL through `with_installed_driver`.
"""

from __future__ import annotations

import importlib

from abtune.errors import ConfigError
from abtune.redact import redact

POSTGRES_DRIVERS = ("psycopg2", "psycopg")  # `abtune[postgres]` installs the first; psycopg 3 serves as well
POSTGRES_SCHEMES = ("postgresql", "postgres")  # `postgres://` is Heroku's and libpq's spelling
INSTALL_HINT = "pip install 'abtune[postgres]'"


def with_installed_driver(url: str) -> str:
    """`postgresql+DRIVER://...` for a PostgreSQL URL that names no driver; any other URL as it is."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme not in POSTGRES_SCHEMES:
        return url
    for driver in POSTGRES_DRIVERS:
        if _importable(driver):
            return f"postgresql+{driver}://{rest}"
    raise ConfigError(f"{redact(url)}: no PostgreSQL driver is installed ({' or '.join(POSTGRES_DRIVERS)}); "
                      f"{INSTALL_HINT}")


def missing_driver(url: str, error: ImportError) -> ConfigError:
    """The one line for a URL whose driver SQLAlchemy could not import (`mysql://` without mysqlclient)."""
    cause = error if isinstance(error, ModuleNotFoundError) else error.__cause__
    module = getattr(cause, "name", None) or "its database driver"
    return ConfigError(f"{redact(url)}: the driver module {module} is not installed; install it, or name an "
                       "installed driver in the URL (dialect+driver://...)")


def _importable(module: str) -> bool:
    """Imported, not only found: a driver whose compiled part fails to load is as good as missing."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
