"""Shared helpers: tiny run configs and running the installed `abtune` command."""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

TINY_VIT = {"arch": "vit", "patch_size": 2, "num_layers": 1, "num_heads": 2, "hidden_dim": 16, "mlp_dim": 32}
CLI_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parent.parent

# Bytecode for the suite, even where PYTHONDONTWRITEBYTECODE=1 (this machine's image and CI's set it): without
# it pytest rewrites every test module's asserts again in each xdist worker (seconds each), and every
# `abtune` process a test starts compiles abtune from source (about half a second of CPU each). The caches go
# where Python puts them anyway (__pycache__, ignored by git) and are read whether or not the variable is set;
# only this process and the abtune sources are concerned, never what a test's `abtune` writes.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """abtune compiled once, before any xdist worker or `abtune` process imports it (up to date: stats only).
    An xdist worker ends without finalizing Python, as abtune's processes do (abtune/exiting.py): with torch,
    MLflow and a session's tests loaded, the teardown took seconds, which the main process waited for after the
    last test. Registered before the tests' own exit handlers, it runs after them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import atexit

        atexit.register(_end_worker)
    else:
        import compileall

        compileall.compile_dir(REPO / "abtune", quiet=2)


def _end_worker() -> None:
    """Imports abtune only at the end: at configure time pytest-cov has not started measuring yet."""
    from abtune.exiting import exit_without_finalizing

    exit_without_finalizing(0)


def abtune_command() -> list[str]:
    installed = shutil.which("abtune", path=str(Path(sys.executable).parent))
    return [installed] if installed else [sys.executable, "-m", "abtune.cli"]


def run_cli(*args: str, cwd: Path | None = None, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`abtune ARGS`; by default with the checkout on PYTHONPATH, so the command can load the hooks that
    tests define (`tests.test_hooks:stop_at`) as it loads a user's own before the ranks start."""
    env = {**(with_checkout_on_path(os.environ) if env is None else env), "COLUMNS": "200"}
    result = subprocess.run(
        [*abtune_command(), *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=cwd, env=env
    )
    if check and result.returncode != 0:
        raise AssertionError(f"abtune {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@dataclasses.dataclass(frozen=True)
class CliResult:
    """What `abtune ARGS` ended with, as subprocess.CompletedProcess names it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def abtune_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """`abtune ARGS` as `abtune.cli.main(ARGS)` in this process, its exit code and what it printed: for tests of
    what a command says, where a new Python process (start-up, imports: seconds under load) adds nothing.
    `cwd` is the folder it runs in; `env` sets variables (None: unset) for the call and the rest of the test.
    Each command keeps one test through the installed entry point (`run_cli`)."""
    return _in_process(capsys, monkeypatch)


@pytest.fixture
def abtune_main_fd(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """`abtune_main`, what was printed read from the file descriptors as run_cli reads a command's: what the
    ranks print (to the descriptors they inherit) counts too."""
    return _in_process(capfd, monkeypatch)


def _in_process(capture: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    from abtune.cli import main

    def call(*args: str, cwd: Path | None = None, env: Mapping[str, str | None] | None = None) -> CliResult:
        monkeypatch.setenv("COLUMNS", "200")  # as run_cli gives the command
        for forcing in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # rich's: colours and a terminal that capsys is not
            monkeypatch.delenv(forcing, raising=False)
        for name, value in (env or {}).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capture.readouterr()  # what the test printed before is not the command's
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors (and --help: 0)
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        out, err = capture.readouterr()
        return CliResult(code, out, err)

    return call


@pytest.fixture
def plots_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that read what a study or run publishes but never its PNGs: each figure is still built from its
    data, then closed without being laid out, drawn and written (an empty file in its place). Drawing is most of
    a plot's third of a second of CPU; tests/test_study_plots.py and tests/test_plots_*.py test what is drawn."""
    import matplotlib.pyplot as plt

    from abtune.tracking import plots

    def built_only(figure: Any, path: Path) -> plots.Drawn:
        plt.close(figure)
        path.write_bytes(b"")
        return plots.Drawn(path, {}, 0, [])

    monkeypatch.setattr(plots, "_save", built_only)


def train_and_read(config: Path, run_dir: Path, nproc: int, ranks_per_node: int, *extra: str) -> dict[str, Any]:
    """`abtune train` of a config on local ranks, and the summary.json it wrote (through read_summary).
    Untracked: MLflow adds seconds of imports and plots per run, and tests/test_tracking*.py test it."""
    from abtune.runfiles import read_summary

    run_cli(*train_args(config, run_dir, nproc, ranks_per_node, *extra))
    return read_summary(run_dir).raw


def train_args(config: Path, run_dir: Path, nproc: int, ranks_per_node: int, *extra: str) -> list[str]:
    """The arguments of an untracked `abtune train` on local ranks into `run_dir` (train_and_read's, train_here's)."""
    return ["train", str(config), "--nproc", str(nproc), "--ranks-per-node", str(ranks_per_node),
            "--run-dir", str(run_dir), "--no-tracking", *extra]


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `condition` until it returns something true, and return that; fail after `timeout_s` (a safety
    net for a hung process, never what a test checks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def with_checkout_on_path(env: Mapping[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}


def write_config(path: Path, **sections: Any) -> Path:
    config = {"name": "tiny", "seed": 0, "model": dict(TINY_VIT), "data": {"name": "digits"},
              "train": {"steps": 40, "local_batch_size": 16, "eval_every": 1000},
              "optimizer": {"name": "adamw", "lr": 0.003}, "method": {"name": "ddp"}}
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(config))
    return path


# Tests that must not run beside each other on two pytest-xdist workers, by file: the SLURM cluster's fixed
# ports (tests/slurm) and the Grid Engine cell's (tests/gridengine), the fabric tests' before/after snapshots of
# every namespace, link and qdisc; and a server each worker would start a copy of (PostgreSQL).
SHARED_MACHINE = {"tests/slurm/": "slurm", "tests/gridengine/": "gridengine", "tests/test_fabric.py": "fabric",
                  "tests/postgres/": "postgres", "tests/test_study_postgres.py": "postgres"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -q` runs on two pytest-xdist workers (pyproject's addopts: `-n 2 --dist loadgroup`): most
    tests wait on process start-up, polls and schedulers. Our own groups, by test id (pytest 9 ignores the
    ids pytest-xdist 3.8 gives `xdist_group` marks, so those marks would group nothing)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_slow_first", False):  # the first assignment: the queue is complete
                self.workqueue = collections.OrderedDict(sorted(self.workqueue.items(), key=_slow_units_first))
                self._slow_first = True
            super()._assign_work_unit(node)

    return Groups(config, log)


def _slow_units_first(unit: tuple[str, dict[str, bool]]) -> tuple[bool, int]:
    """Longest first, so that the run does not end on one worker training while the other idles: the units
    with a slow test (the SLURM and fabric groups, studies, trained runs), the biggest of them first."""
    scope, tests = unit
    return not any(_is_slow(nodeid) for nodeid in tests), -len(tests)


def _is_slow(nodeid: str) -> bool:
    path, _, name = nodeid.partition("::")
    marks = _slow_marks(path)
    return marks[0] or name.split("[")[0] in marks[1]


@functools.cache
def _slow_marks(path: str) -> tuple[bool, frozenset[str]]:
    """Whether the whole file is marked slow (pytestmark), and the tests marked one by one."""
    file = REPO / path
    text = file.read_text() if file.is_file() else ""
    whole = re.search(r"^pytestmark = .*pytest\.mark\.slow", text, re.MULTILINE) is not None
    marked = re.findall(r"^@pytest\.mark\.slow.*\n(?:@.*\n|\s.*\n)*?def (test_\w+)", text, re.MULTILINE)
    return whole, frozenset(marked)


def xdist_group(nodeid: str) -> str:
    """The unit one worker runs in turn: a group of SHARED_MACHINE, a whole file whose fixtures train once
    for the module, or else the test alone."""
    path = nodeid.split("::")[0]
    shared = next((group for prefix, group in SHARED_MACHINE.items() if path.startswith(prefix)), None)
    return shared or (path if _has_module_fixture(path) else nodeid)


@functools.cache
def _has_module_fixture(path: str) -> bool:
    file = REPO / path
    return file.is_file() and re.search(r"""scope=["'](module|class)["']""", file.read_text()) is not None


@pytest.fixture
def one_rank_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real torch.distributed world of one rank (gloo) in this process, for methods tested in process."""
    from abtune.dist import init_distributed, shutdown
    from abtune.launch.local import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    env = init_distributed(timeout_s=60)
    yield env
    shutdown()


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The shipped quickstart study with its eight trials stored (tests/quickstart_fixture.py): its folder and
    storage URL, made once for the session. Tests only read it; one that changes it makes its own."""
    from tests.quickstart_fixture import quickstart_study

    folder = tmp_path_factory.mktemp("quickstart")
    return folder, quickstart_study(folder)


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "run.yaml")


@pytest.fixture(scope="session", autouse=True)
def _warm_rank_server() -> Iterator[None]:
    """One warm rank server for the whole session (abtune/launch/warm.py): every run a test starts, in
    this process or through the `abtune` command, forks its ranks from it instead of importing torch in
    each. Started by the first run (a session without runs starts none), stopped and waited for at the
    end. ABTUNE_WARM_START=0 runs the suite cold."""
    from abtune.launch.warm import owned_server

    with owned_server(wait=True):
        yield


@pytest.fixture(scope="session", autouse=True)
def _importances_computed_once_per_input(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Optuna's importances of one set of trials (fANOVA, seeded: the same parameters, values and objective
    give the same numbers) computed once in this session, by whichever pytest-xdist worker needs them first:
    `study best` fits 40 forests for them (an objective's and 19 shufflings', twice), seconds each time, and
    dozens of tests print the same stored study (tests/importance_cache.py; the commands that tests/terminal.py starts
    read them too). The fits recorded in tests/fixtures/importances.json are read, not made; the whole suite checks
    the recording against Optuna. A test that stubs `_importances_of` replaces this meanwhile; one
    that stubs what it calls (Optuna's evaluator) must stub `_importances_of` instead, or it may read a stored result."""
    from tests.importance_cache import importances_computed_once

    with importances_computed_once(_session_folder(tmp_path_factory, "importances")):
        yield


TRACKING_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store_outside_the_repo(tmp_path_factory: pytest.TempPathFactory,
                                   request: pytest.FixtureRequest) -> Iterator[None]:
    """`abtune train` tracks by default into ./mlflow.db; tests that do not choose a store share one in
    a temporary folder. Session scope: module-scoped fixtures that train run before function ones.
    Where the collected tests imported MLflow (the whole suite's do), they will track: the store starts as
    a copy of the session's migrated one instead of running every migration again (seconds of CPU)."""
    store = tmp_path_factory.getbasetemp() / "mlflow-tests" / "mlflow.db"
    store.parent.mkdir(exist_ok=True)
    if "mlflow" in sys.modules:
        shutil.copy(request.getfixturevalue("_mlflow_template"), store)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
        for name in TRACKING_VARIABLES[1:]:
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True)
def _restore_tracking_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracking code exports these; whatever a test changes is undone after it."""
    for name in TRACKING_VARIABLES:
        value = os.environ.get(name)
        monkeypatch.setenv(name, value or "unset")  # records the value to restore, even "not set"
        if value is None:
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, migrated once per session by whichever xdist worker needs it first."""
    path = _session_folder(tmp_path_factory, "mlflow-template") / "mlflow.db"
    with (path.parent / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            from mlflow import MlflowClient

            migrating = path.with_name(f"migrating-{os.getpid()}.db")
            MlflowClient(f"sqlite:///{migrating}").search_experiments()
            os.replace(migrating, path)  # whole or absent for the other worker
    return path


def _session_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test session that its pytest-xdist workers share."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def mlflow_db(tmp_path: Path, _mlflow_template: Path) -> Path:
    """A fresh MLflow SQLite file, already migrated (a new one runs every migration: seconds each)."""
    target = tmp_path / "mlflow-store" / "mlflow.db"
    target.parent.mkdir()
    shutil.copy(_mlflow_template, target)
    return target
