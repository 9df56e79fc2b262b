"""`abtune ui`: the MLflow UI and optuna-dashboard side by side, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import getpass
import signal
import socket
import tempfile
import threading
from pathlib import Path
from types import FrameType

from abtune.redact import redact
from abtune.tracking import servers


def serve(tracking_uri: str, storage: str | None, host: str = "127.0.0.1") -> int:
    """Start the dashboards, print where they are, block until told to stop, stop them all."""
    stop_requested = threading.Event()
    previous = {s: signal.signal(s, _setter(stop_requested)) for s in (signal.SIGINT, signal.SIGTERM)}
    started: list[servers.Service] = []
    try:
        with tempfile.TemporaryDirectory(prefix="abtune-ui-") as logs:
            started = _start_all(tracking_uri, storage, host, Path(logs))
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


def _start_all(tracking_uri: str, storage: str | None, host: str, logs: Path) -> list[servers.Service]:
    started = []
    if not tracking_uri.startswith(("http://", "https://")):  # a server is already a UI
        started.append(servers.start_mlflow_server(tracking_uri, host=host, log=logs / "mlflow.log"))
    if storage:
        started.append(servers.start_optuna_dashboard(storage, host=host, log=logs / "optuna.log"))
    return started


def _print_access(started: list[servers.Service], tracking_uri: str) -> None:
    if tracking_uri.startswith(("http://", "https://")):
        print(f"MLflow UI:        {redact(tracking_uri)} (the tracking server itself)")
    for service in started:
        print(f"{service.name + ':':<17} {service.url}")
    if started:
        forwards = " ".join(f"-L {s.port}:127.0.0.1:{s.port}" for s in started)
        print(f"from your laptop: ssh -N {forwards} {getpass.getuser()}@{socket.getfqdn()}")
    print("Ctrl-C stops them." if started else "nothing to start here (no --storage)", flush=True)
