"""`abtune ui` where a dashboard cannot start: its command or package missing from the environment, its
port taken. Each ends in one line that says what to do, and leaves no server running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import psutil
import pytest

from abtune.errors import AbtuneError
from abtune.tracking import servers
from tests.conftest import wait_for, with_checkout_on_path

SECRET = "hunter2-s3cret"


def python_without(folder: Path, packages: tuple[str, ...] = (), commands: tuple[str, ...] = ()) -> Path:
    """A virtual environment with every package this one has but `packages` (import names), and of the
    commands beside this Python only `commands`: the Python of an environment where they are missing."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = folder / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    hidden = tuple(p.replace("_", "-") for p in packages) + packages
    for installed in (Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()):
        for entry in installed.iterdir():
            # .pth files would add the hidden packages' folders back (and this checkout: PYTHONPATH does)
            if entry.suffix == ".pth" or entry.name.startswith(hidden) or (site / entry.name).exists():
                continue
            (site / entry.name).symlink_to(entry)
    for command in commands:  # this Python's, or else the one on PATH (a venv that borrows another's packages)
        beside = Path(sys.executable).parent / command
        (folder / "bin" / command).symlink_to(beside if beside.exists() else shutil.which(command) or beside)
    return folder / "bin" / "python"


def _path_without(command: str) -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not shutil.which(command, path=d))


def _ui(python: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**with_checkout_on_path(os.environ), "PATH": _path_without("mlflow"), "COLUMNS": "100"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([str(python), "-m", "abtune.cli", "ui"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _servers_on(store: Path) -> list[psutil.Process]:
    """Processes started for the MLflow store `store` (the URL reaches them in their environment)."""
    found = []
    for process in psutil.process_iter():
        try:
            if str(store) in process.environ().get("MLFLOW_BACKEND_STORE_URI", ""):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.slow  # a new Python (an environment without MLflow)
def test_without_the_mlflow_command_abtune_ui_says_what_to_install(tmp_path: Path) -> None:
    python = python_without(tmp_path / "env")
    (tmp_path / "mlflow.db").touch()
    result = _ui(python, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"abtune: error: no `mlflow` command beside {python} or on PATH; install "
                                          "it in this environment (pip install mlflow) or put it on PATH"]


@pytest.mark.slow  # starts a server (MLflow's; http.server)
def test_without_optuna_dashboard_abtune_ui_says_so_and_stops_the_mlflow_it_started(tmp_path: Path) -> None:
    python = python_without(tmp_path / "env", packages=("optuna_dashboard",), commands=("mlflow",))
    (tmp_path / "mlflow.db").touch()
    (tmp_path / "optuna.db").touch()
    result = _ui(python, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"abtune: error: optuna-dashboard is not installed for {python}; "
                                          "install it in this environment (pip install optuna-dashboard)"]
    assert _servers_on(tmp_path / "mlflow.db") == []


def test_a_port_another_program_holds_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(AbtuneError, match=rf"^MLflow cannot listen on 127.0.0.1:{port} \(Address already in use\); "
                                              "another program holds the port: start again to pick a free one$"):
            servers.start_mlflow_server(f"sqlite:///{tmp_path / 'mlflow.db'}", port=port)
    assert _servers_on(tmp_path / "mlflow.db") == []


SERVED_TWICE = ("import sys, time\n"
                "deadline = time.monotonic() + 120\n"
                "while open(sys.argv[1]).read().count('GET /') < int(sys.argv[2]) and time.monotonic() < deadline:\n"
                "    time.sleep(0.05)\n")


@pytest.mark.slow  # starts a server (MLflow's; http.server)
def test_a_page_another_program_serves_on_the_port_is_not_the_service_being_ready(tmp_path: Path) -> None:
    """A program that takes the port while the service starts answers 200 there; the service, unable to
    listen, exits: that is what wait_ready reports, not a UI that is somebody else's."""
    port = servers.free_port()
    requests = tmp_path / "requests.log"  # http.server logs each request it answers, one line each
    with requests.open("w") as log:
        other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path)
    wait_for(lambda: _answers(port), 60, "a page on the port")
    asked = requests.read_text().count("GET /")
    # the service runs until the other program's page has answered wait_ready twice (its 200 seen and not taken
    # for the service's), then exits as a service that could not listen does
    service = servers.Service("MLflow", f"http://127.0.0.1:{port}", subprocess.Popen(
        [sys.executable, "-c", SERVED_TWICE, str(requests), str(asked + 2)]))
    try:
        with pytest.raises(AbtuneError, match="^MLflow exited with code 0$"):
            servers.wait_ready(service)
    finally:
        servers.stop(service)
        other.kill()
        other.wait()


def test_an_mlflow_database_that_does_not_answer_ends_at_once_with_its_password_masked() -> None:
    """Checked before the server starts: `mlflow server` retries such a database for about 100 s."""
    port = servers.free_port()  # nothing listens there
    with pytest.raises(AbtuneError) as refused:
        servers.start_mlflow_server(f"postgresql+psycopg2://bob:{SECRET}@127.0.0.1:{port}/mlflow")
    message = str(refused.value)
    assert message.startswith(f"cannot reach the MLflow store postgresql+psycopg2://bob:***@127.0.0.1:{port}/mlflow: "
                              "OperationalError: "), message
    assert SECRET not in message and len(message.splitlines()) == 1
