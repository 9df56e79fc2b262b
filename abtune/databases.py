"""Database URLs as people write them: `postgresql://user:password@host/db` opens with the PostgreSQL
driver that is installed.

SQLAlchemy maps a URL that names no driver to a driver of its own choosing (psycopg2 up to SQLAlchemy
2.0, psycopg 3 from 2.1), so the same URL failed wherever the other one was installed: Optuna said
"Failed to import DB access module", which reads like an unreachable server, and MLflow raised a
traceback. The study storage and the MLflow store both open their URL through `with_installed_driver`.
"""

from __future__ import annotations

import importlib
import re

from abtune.errors import ConfigError
from abtune.redact import redact

POSTGRES_DRIVERS = ("psycopg2", "psycopg")  # `abtune[postgres]` installs the first; psycopg 3 serves as well
POSTGRES_SCHEMES = ("postgresql", "postgres")  # `postgres://` is Heroku's and libpq's spelling
INSTALL_HINT = "pip install 'abtune[postgres]'"
_SCHEME = re.compile(r"[A-Za-z][\w+.\-]*://")
_CREDENTIALS = re.compile(r":[^\s]*@")


def check_url_shape(url: str, what: str) -> None:
    """A ConfigError (password masked) for a URL that carries credentials but cannot be read as meant.

    Two typos reach a driver otherwise and come back as "unreachable", quoting the URL: a mistyped scheme
    (`postgresql:/`, `postgresql//`, none) and a password holding an unencoded `@`, whose tail the driver
    then names as the host.
    """
    scheme = _SCHEME.match(url)
    if scheme is None and _CREDENTIALS.search(url):
        raise ConfigError(f"{what} {redact(url)} is not a URL: it needs a scheme and :// before the user "
                          "and password (postgresql://, mysql://, https://)")
    userinfo = url[scheme.end():].rpartition("@")[0] if scheme else ""
    if "@" in userinfo and not url.startswith(("http://", "https://")):  # http(s) splits at the last '@'; drivers do not
        raise ConfigError(f"{what} {redact(url)}: the password holds an unencoded '@'; write it as %40 "
                          "(percent-encode '@', ':' and '/' in a password)")


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
