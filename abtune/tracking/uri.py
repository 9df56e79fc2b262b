"""Where MLflow records go, and how credentials travel: never inside a URI that gets printed.

Order: `--tracking-uri` > `MLFLOW_TRACKING_URI` > `sqlite:///mlflow.db` in the working directory
(made absolute, so ranks started elsewhere write to the same file; artifacts go to `mlartifacts/`
beside it). A `postgresql://` store names the driver that is installed (`abtune.databases`). A password in an http(s) URI (`https://me:secret@host`) is moved into MLflow's own
variables `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`, which the ranks inherit; the
URI that remains holds no secret. Everything shown to people goes through `redact`.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from abtune.databases import check_url_shape, with_installed_driver
from abtune.redact import redact

DEFAULT_DB = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
URI_VARIABLE = "MLFLOW_TRACKING_URI"
USER_VARIABLE = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"  # noqa: S105 - a variable name, not a secret


def resolve_tracking_uri(explicit: str | None = None, workdir: Path | None = None) -> str:
    """The tracking URI to use, with a relative SQLite path made absolute and a PostgreSQL driver named."""
    uri = explicit or os.environ.get(URI_VARIABLE) or f"sqlite:///{DEFAULT_DB}"
    check_url_shape(uri, "tracking URI")
    return with_installed_driver(_absolute_sqlite(uri, workdir or Path.cwd()))


def _absolute_sqlite(uri: str, workdir: Path) -> str:
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri.startswith(prefix + "/") or uri == prefix + ":memory:":
        return uri
    return f"{prefix}{(workdir / uri.removeprefix(prefix)).resolve()}"


def local_artifact_root(uri: str) -> Path | None:
    """`mlartifacts/` beside a SQLite file; None for stores that choose their own (a server)."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent / ARTIFACTS_DIR
    return None


def export_tracking_uri(uri: str) -> str:
    """Set the variables the ranks inherit; return the URI without credentials (safe to show)."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.password is not None:
        os.environ[USER_VARIABLE] = unquote(parts.username or "")
        os.environ[PASSWORD_VARIABLE] = unquote(parts.password)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        uri = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    os.environ[URI_VARIABLE] = uri
    return uri


class RedactingFilter(logging.Filter):
    """Masks URL credentials in MLflow's own log lines (its errors quote the URL they called)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def quiet_secrets_in_mlflow_logs() -> None:
    """Call after importing mlflow: a logger's filter misses its children's records, a handler's does not."""
    for handler in [*logging.getLogger("mlflow").handlers, *logging.getLogger().handlers]:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    """--tracking-uri and --no-tracking, the same on every command that records runs."""
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--no-tracking", action="store_true", help="record nothing in MLflow")


def tracking_arguments(args: argparse.Namespace) -> list[str]:
    """The tracking flags a command was given, to print a command that carries on (a password masked)."""
    return (["--tracking-uri", redact(args.tracking_uri)] if args.tracking_uri else []) + (
        ["--no-tracking"] if args.no_tracking else [])
