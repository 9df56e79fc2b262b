"""Dashboards as child processes: the MLflow UI (an `mlflow server`) and optuna-dashboard.

Each one runs in its own process group on 127.0.0.1 and a free port, so stopping it ends every
process it started (uvicorn workers included) and nothing else. Store URLs reach them through the
environment, never the command line (which any user of the machine can read).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from abtune.errors import AbtuneError, ConfigError
from abtune.ports import free_port
from abtune.redact import redact
from abtune.tracking.store import check_database, refused_revision
from abtune.tracking.uri import local_artifact_root

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
DASHBOARD_STORAGE_VARIABLE = "ABTUNE_DASHBOARD_STORAGE"
MLFLOW = "MLflow"
QUIET_SERVER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path | None = None
    store: str | None = None  # the MLflow store it serves

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])


def _executable(name: str, package: str) -> str:
    """`name` beside this Python (its virtual environment), else on PATH; neither ends in one line."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise ConfigError(f"no `{name}` command beside {sys.executable} or on PATH; install it in this "
                          f"environment (pip install {package}) or put it on PATH")
    return found


def _require_module(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{package} is not installed for {sys.executable}; install it in this environment "
                          f"(pip install {package})")


def _require_free(name: str, host: str, port: int) -> None:
    """A port another program listens on would answer for the service: refuse it before starting."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no owner
        try:
            sock.bind((host, port))
        except OSError as error:
            raise AbtuneError(f"{name} cannot listen on {host}:{port} ({error.strerror}); another program holds "
                              "the port: start again to pick a free one") from None


def _start(name: str, command: list[str], env: dict[str, str], port: int, host: str, log: Path | None,
           store: str | None = None) -> Service:
    _require_free(name, host, port)
    stream = log.open("ab") if log else subprocess.DEVNULL
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=stream, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    return Service(name, f"http://{host}:{port}", process, log, store)


def start_mlflow_server(backend_uri: str, *, host: str = "127.0.0.1", port: int | None = None,
                        log: Path | None = None) -> Service:
    """`mlflow server` on `backend_uri`; artifacts of a SQLite store are served from mlartifacts/ beside it.
    A database MLflow cannot use ends here in one line, before the server writes to it."""
    try:
        check_database(backend_uri)
    except AbtuneError:
        raise
    except Exception as error:  # noqa: BLE001 - the database's driver says why, in its words
        text = str(error).strip().splitlines()
        raise AbtuneError(f"cannot reach the MLflow store {redact(backend_uri)}: {type(error).__name__}: "
                          f"{redact(text[0]) if text else ''}") from None
    port = port or free_port()
    command = [_executable("mlflow", "mlflow"), "server", "--host", host, "--port", str(port), "--workers", "1"]
    artifacts = local_artifact_root(backend_uri)
    if artifacts is not None:
        command += ["--artifacts-destination", str(artifacts)]
    return _start(MLFLOW, command, {"MLFLOW_BACKEND_STORE_URI": backend_uri, **QUIET_SERVER}, port, host, log,
                  store=backend_uri)


def start_optuna_dashboard(storage: str, *, host: str = "127.0.0.1", port: int | None = None,
                           log: Path | None = None) -> Service:
    _require_module("optuna_dashboard", "optuna-dashboard")
    port = port or free_port()
    command = [sys.executable, "-m", "abtune.tracking.dashboard", host, str(port)]
    return _start("optuna-dashboard", command, {DASHBOARD_STORAGE_VARIABLE: storage}, port, host, log)


def wait_ready(service: Service, timeout: float = READY_TIMEOUT_S) -> None:
    """Until the page answers 200 from the service's own processes; an exit or the timeout raises AbtuneError
    with the log's last line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            last = _last_line(service)
            refused = refused_revision(service.store, last) if service.store else None
            raise refused or AbtuneError(f"{service.name} exited with code {service.process.returncode}{last}")
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(service.url + "/", timeout=5) as response:
            if response.status == 200 and _listens(service):
                return
        time.sleep(0.3)
    raise AbtuneError(f"{service.name} did not answer on {service.url} within {timeout:.0f} s{_last_line(service)}")


def _listens(service: Service) -> bool:
    """Whether the service's own processes listen on its port: a program that took the port while the
    service started answers too, and the service then exits."""
    import psutil

    with contextlib.suppress(psutil.Error):
        leader = psutil.Process(service.process.pid)
        for process in (leader, *leader.children(recursive=True)):
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == service.port
                   for c in process.net_connections("tcp")):
                return True
    return False


def _last_line(service: Service) -> str:
    if service.log is None or not service.log.exists():
        return ""
    lines = [line for line in service.log.read_text(errors="replace").splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""


def stop(service: Service) -> None:
    """SIGTERM to the service's process group, SIGKILL after a grace period; waits for the leader."""
    if service.process.poll() is None:
        _signal_group(service.process.pid, signal.SIGTERM)
        try:
            service.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(service.process.pid, signal.SIGKILL)
            service.process.wait()
    _signal_group(service.process.pid, signal.SIGKILL)  # workers that outlived their leader


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
