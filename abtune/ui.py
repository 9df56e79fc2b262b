"""`abtune ui`: the MLflow UI and optuna-dashboard side by side, until Ctrl-C or SIGTERM.

Without options it serves the default stores of the working directory (`./mlflow.db`, `./optuna.db`)
that exist and says which it found; a store named by a flag or an environment variable must exist.
It sits above tracking/ and study/, whose stores it serves side by side.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import tempfile
import threading
from pathlib import Path
from types import FrameType

from abtune.databases import with_installed_driver
from abtune.errors import ConfigError
from abtune.redact import redact
from abtune.study.storage import (
    STORAGE_VARIABLE,
    absolute_url,
    open_storage,
    resolve_storage_url,
    storage_file,
)
from abtune.tracking import servers, view
from abtune.tracking.uri import URI_VARIABLE, resolve_tracking_uri

EXPERIMENT_LINKS = 10  # the most recently updated experiments abtune lists with their direct links


def choose_stores(tracking_flag: str | None, storage_flag: str | None) -> tuple[str | None, str | None]:
    """The MLflow store and the Optuna storage to serve; a default one only if its file is here."""

    tracking = _existing(resolve_tracking_uri(tracking_flag), asked=bool(tracking_flag or os.environ.get(URI_VARIABLE)),
                         what="MLflow store", flag="--tracking-uri")
    storage_url = with_installed_driver(absolute_url(resolve_storage_url(storage_flag)))
    storage = _existing(storage_url, asked=bool(storage_flag or os.environ.get(STORAGE_VARIABLE)),
                        what="Optuna storage", flag="--storage", file=storage_file(storage_url))
    if storage is not None:  # unreachable, corrupt or malformed: one line now, not the dashboard's traceback later
        open_storage(storage)
    if tracking is None and storage is None:
        raise ConfigError("no ./mlflow.db or ./optuna.db here; run abtune ui where you trained, "
                          "or pass --tracking-uri / --storage")
    found = [f"{what} {redact(url)}" for what, url in (("MLflow store", tracking), ("Optuna storage", storage)) if url]
    print(f"abtune ui: found {' and '.join(found)}")
    return tracking, storage


def _existing(url: str, *, asked: bool, what: str, flag: str, file: Path | None = None) -> str | None:
    """`url` if it can be served; a missing default file is skipped with a note, a missing asked-for one stops."""
    if file is None and url.startswith("sqlite:///"):
        file = Path(url.removeprefix("sqlite:///"))
    if file is None or file.is_file():
        return url
    if asked:
        raise ConfigError(f"no {what} at {redact(url)}; check {flag} (or the environment), or run abtune ui "
                          "where you trained")
    print(f"abtune ui: no {file.name} here, so no {what}; pass {flag} to serve one elsewhere")
    return None


def serve(tracking_uri: str | None, storage: str | None, host: str = "127.0.0.1") -> int:
    """Start the dashboards, print where they are, block until told to stop, stop them all."""
    stop_requested = threading.Event()
    previous = {s: signal.signal(s, _setter(stop_requested)) for s in (signal.SIGINT, signal.SIGTERM)}
    started: list[servers.Service] = []
    try:
        with tempfile.TemporaryDirectory(prefix="abtune-ui-") as logs:
            _start_all(started, tracking_uri, storage, host, Path(logs))
            if not started:
                _print_access(started, tracking_uri)
                return 0
            for service in started:
                servers.wait_ready(service)
            _print_access(started, tracking_uri)
            while not stop_requested.wait(0.5):
                if any(s.process.poll() is not None for s in started):
                    dead = next(s for s in started if s.process.poll() is not None)
                    print(f"abtune ui: {dead.name} stopped (exit {dead.process.returncode}); stopping the rest")
                    return 1
    finally:
        for service in started:
            servers.stop(service)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print("abtune ui: stopped")
    return 0


def _setter(event: threading.Event):  # noqa: ANN202 - a signal handler
    def handler(signum: int, frame: FrameType | None) -> None:
        event.set()

    return handler


def _start_all(started: list[servers.Service], tracking_uri: str | None, storage: str | None, host: str,
               logs: Path) -> None:
    """Into `started`, as each starts: if the second cannot, the caller still stops the first."""
    if tracking_uri and not _is_server(tracking_uri):  # a server is already a UI
        started.append(servers.start_mlflow_server(tracking_uri, host=host, log=logs / "mlflow.log"))
    if storage:
        started.append(servers.start_optuna_dashboard(storage, host=host, log=logs / "optuna.log"))


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _print_experiments(started: list[servers.Service], tracking_uri: str | None) -> None:
    """Direct links to abtune's experiments: they open the model-training view with each run's results."""
    mlflow_ui = next((s.url for s in started if s.name == servers.MLFLOW), None)
    if tracking_uri is None or mlflow_ui is None:
        return
    try:
        links = view.experiment_links(tracking_uri, mlflow_ui, EXPERIMENT_LINKS)
    except Exception as error:  # noqa: BLE001 - the links are a convenience; the UI itself is up
        print(f"  (no experiment links: {redact(str(error).splitlines()[0] if str(error) else type(error).__name__)})")
        return
    for name, link in links:
        print(f"  experiment {name}: {link}")


def _print_access(started: list[servers.Service], tracking_uri: str | None) -> None:
    if tracking_uri and _is_server(tracking_uri):
        print(f"MLflow UI:        {redact(tracking_uri)} (the tracking server itself)")
    for service in started:
        print(f"{service.name + ':':<17} {service.url}")
    if started:
        forwards = " ".join(f"-L {s.port}:127.0.0.1:{s.port}" for s in started)
        print(f"from your laptop: ssh -N {forwards} {getpass.getuser()}@{socket.getfqdn()}")
    _print_experiments(started, tracking_uri)
    print("Ctrl-C stops them." if started else "nothing to start here (no --storage)", flush=True)
