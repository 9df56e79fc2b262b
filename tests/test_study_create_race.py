"""Two `abtune study create` of one name at once: the loser reads the study the winner made (same definition:
nothing to do) or refuses in one line; neither the race to create Optuna's tables in a fresh database nor the
race to create the study ends in "unreachable" or a traceback. Also the storage problems a user meets next:
a corrupt SQLite file is called corrupt, an unreachable database behind `abtune ui` is called unreachable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from abtune.cli import main
from abtune.study import lifecycle, storage
from tests.conftest import REPO, with_checkout_on_path

pytest_plugins = ["tests.postgres.fixture"]

QUICKSTART = REPO / "studies" / "quickstart.yaml"
NOTHING_TO_DO = "with this definition; nothing to do"

# One process imports abtune and what `study create` imports (its cost estimate builds the model: torch,
# torchvision; 4-5 s of CPU), then forks the racers, each its own process with its own connections, opened after
# the fork; each waits for the go file, so that all of them reach the storage together, and leaves its output in
# files of its own. Each racer ends without finalizing or exit handlers: the parent's are not its own.
AT_ONCE = textwrap.dedent("""
    import os, sys, time, traceback
    from abtune.cli import main
    from abtune.exiting import exit_without_finalizing
    import abtune.data, abtune.models, abtune.study.cost, psutil
    assert psutil.Process().num_threads() == 1, "a fork would lose the other threads' locks"
    go, folder, count, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    racers = []
    for racer in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, name in ((1, "out"), (2, "err")):
                    os.dup2(os.open(os.path.join(folder, f"{racer}.{name}"), os.O_WRONLY | os.O_CREAT), fd)
                while not os.path.exists(go):
                    time.sleep(0.01)
                code = main(args)
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else int(done.code is not None)
            except BaseException:
                traceback.print_exc()
            finally:
                exit_without_finalizing(code)
        racers.append(pid)
    print("ready", flush=True)
    print(" ".join(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])) for pid in racers), flush=True)
""")


def _create_at_once(tmp_path: Path, study_file: Path, count: int, url: str) -> list[subprocess.CompletedProcess[str]]:
    go, folder = tmp_path / "go", tmp_path / "racers"
    folder.mkdir()
    # one OpenMP thread, as the warm rank server's: torch's import starts no thread then, and the parent forks
    env = {**with_checkout_on_path(os.environ), "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    args = ["study", "create", str(study_file), "--storage", url]
    parent = subprocess.Popen([sys.executable, "-c", AT_ONCE, str(go), str(folder), str(count), *args], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    assert parent.stdout.readline() == "ready\n", parent.communicate(timeout=60)[1]
    go.touch()
    codes, err = parent.communicate(timeout=300)
    assert parent.returncode == 0 and err == "", err
    return [subprocess.CompletedProcess(args, int(code), (folder / f"{racer}.out").read_text(),
                                        (folder / f"{racer}.err").read_text())
            for racer, code in enumerate(codes.split())]


def _check_one_created_the_rest_nothing_to_do(results: list[subprocess.CompletedProcess[str]], url: str) -> None:
    assert [r.returncode for r in results] == [0] * len(results), [r.stderr for r in results]
    assert all(r.stderr == "" for r in results), [r.stderr for r in results]
    outputs = [r.stdout for r in results]
    assert sum("created study quickstart" in out for out in outputs) == 1, outputs
    assert sum(NOTHING_TO_DO in out for out in outputs) == len(results) - 1, outputs
    study = optuna.load_study(study_name="quickstart", storage=url)
    assert optuna.get_all_study_names(url) == ["quickstart"]
    assert len(study.trials) == 2  # the two reference trials, enqueued once


@pytest.mark.slow
def test_four_creates_at_once_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _check_one_created_the_rest_nothing_to_do(_create_at_once(tmp_path, QUICKSTART, 4, url), url)


@pytest.mark.slow
def test_four_creates_at_once_on_postgresql(tmp_path: Path, postgres_db_url: str) -> None:
    _check_one_created_the_rest_nothing_to_do(_create_at_once(tmp_path, QUICKSTART, 4, postgres_db_url),
                                              postgres_db_url)


def _racing_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loser's view: no study yet when it looks, the winner's study there when it creates its own."""
    monkeypatch.setattr(lifecycle, "_exists", lambda storage, name: False)


def test_the_loser_of_a_create_race_with_the_same_definition_has_nothing_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert main(["study", "create", str(QUICKSTART), "--storage", url]) == 0
    _racing_exists(monkeypatch)
    capsys.readouterr()
    assert main(["study", "create", str(QUICKSTART), "--storage", url]) == 0
    assert NOTHING_TO_DO in capsys.readouterr().out
    assert len(optuna.load_study(study_name="quickstart", storage=url).trials) == 2


def test_the_loser_of_a_create_race_with_another_definition_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert main(["study", "create", str(QUICKSTART), "--storage", url]) == 0
    other = yaml.safe_load(QUICKSTART.read_text()) | {"trials": 9, "base": str(REPO / "studies" / "run_quickstart.yaml")}
    (tmp_path / "quickstart.yaml").write_text(yaml.safe_dump(other))
    _racing_exists(monkeypatch)
    capsys.readouterr()
    assert main(["study", "create", str(tmp_path / "quickstart.yaml"), "--storage", url]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "at the same moment by another process, with a different definition" in err[0], err


def test_a_schema_created_by_another_process_meanwhile_is_opened_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    real = storage.RDBStorage
    failures = iter(["(sqlite3.OperationalError) table study_directions already exists",
                     "(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num"])

    def racing(*args: object, **kwargs: object) -> object:
        for message in failures:
            real(*args, **kwargs)  # the other process's work, then the error the loser saw
            raise optuna.exceptions.StorageInternalError(message)
        return real(*args, **kwargs)

    monkeypatch.setattr(storage, "RDBStorage", racing)
    opened = storage.open_storage(url, create=True)
    assert opened.get_all_studies() == []
    assert next(failures, None) is None


@pytest.mark.parametrize("content", [b"this is text, not a database\n" * 10, bytes(range(256)) * 20])
def test_a_corrupt_sqlite_file_is_called_corrupt(content: bytes, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "optuna.db").write_bytes(content)
    assert main(["study", "status", "quickstart", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and " is corrupt" in err[0] and "unreachable" not in err[0], err
    assert (tmp_path / "optuna.db").read_bytes() == content


def test_abtune_ui_on_an_unreachable_database_says_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["ui", "--storage", "postgresql://abtune:s3cret@127.0.0.1:1/abtune"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is unreachable" in err[0] and "Connection refused" in err[0], err
    assert "s3cret" not in err[0] and "commit" not in err[0]
