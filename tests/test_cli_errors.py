"""Bad input ends in one clear line naming the problem, exit code 2, and no run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from abtune.study import lifecycle
from tests.conftest import CliResult, abtune_command, write_config
from tests.study_helpers import trials_of, write_study


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"method": {"name": "ab", "sigma_cutof": 0.1}}, "method.sigma_cutof: unknown key"),
        ({"method": {"name": "ab", "warmup_frac": 1.5}}, "method.warmup_frac: Input should be less than 1"),
        ({"train": {"steps": 0}}, "train.steps: Input should be greater than or equal to 1"),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr: Input should be a valid number"),
        ({"method": {"name": "ab", "group_size": 3}}, "method.group_size: 3 does not divide the 4 ranks"),
        ({"method": {"name": "ab", "group_size": 4}}, "needs at least 2 groups"),
        ({"method": {"name": "powersgdd"}}, "method"),
        ({"method": {"name": "sbc", "sparsity": 0}}, "method.sparsity: Input should be greater than 0"),
        ({"method": {"name": "sbc", "sparsity": 1.5}}, "method.sparsity: Input should be less than or equal to 1"),
        ({"method": {"name": "sbc", "delay": 0}}, "method.delay: Input should be greater than or equal to 1"),
        ({"method": {"name": "powersgd", "start_step": 1}}, "method.start_step: Input should be greater than or equal to 2"),
    ],
)
def test_bad_config_gives_one_line_and_exit_2(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                              sections: dict, expected: str) -> None:
    config = write_config(tmp_path / "bad.yaml", **sections)
    result = abtune_main("train", str(config), "--nproc", "4", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_missing_config_file(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """In process, as the other errors (`abtune train`'s entry point: test_launchers.py's dry run)."""
    result = abtune_main("train", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"abtune: error: {tmp_path / 'nope.yaml'}: no such file"


def test_uneven_ranks_per_node(tiny_config: Path, abtune_main: Callable[..., CliResult]) -> None:
    result = abtune_main("train", str(tiny_config), "--nproc", "3", "--ranks-per-node", "2")
    assert result.returncode == 2
    assert "--ranks-per-node 2 must divide --nproc 3" in result.stderr


def test_existing_run_is_not_overwritten(tmp_path: Path, tiny_config: Path, abtune_main: Callable[..., CliResult]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: earlier\n")
    result = abtune_main("train", str(tiny_config), "--run-dir", str(run_dir))
    assert result.returncode == 2
    assert "already holds a run" in result.stderr
    assert (run_dir / "config.yaml").read_text() == "name: earlier\n"


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "bad.yaml: the file is empty (or holds only comments); expected a YAML mapping"),
    (b"# nothing yet\n", "bad.yaml: the file is empty (or holds only comments); expected a YAML mapping"),
    (b"train:\n  steps: 3\n   lr: 0.1\n", "bad.yaml:3:6: not valid YAML: mapping values are not allowed here"),
    (b"name: a\nseed: 1\nname: b\n", "bad.yaml:3:1: not valid YAML: key 'name' appears twice (first on line 1)"),
    (bytes(range(256)) * 4, "bad.yaml: a binary file (it contains NUL bytes); expected YAML text"),
    (b"name: caf\xe9\n", "bad.yaml:1:10: not UTF-8 text (byte 0xe9); a binary file, or text in another encoding: save it as UTF-8"),
    (b"name: \x07\n", "bad.yaml:1:7: not valid YAML: control character #x07 is not allowed (is this a binary file?)"),
    (b"- name: tiny\n", "bad.yaml: expected a YAML mapping at the top level, got list"),
])
def test_bad_config_file_gives_one_line_and_exit_2(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                   content: bytes, expected: str) -> None:
    """An empty run config used to train a run on the defaults."""
    (tmp_path / "bad.yaml").write_bytes(content)
    result = abtune_main("train", "bad.yaml", "--run-dir", "run", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, f"abtune: error: {expected}\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_bad_launcher_profile_and_set_value_give_one_line(tmp_path: Path, tiny_config: Path,
                                                          abtune_main: Callable[..., CliResult]) -> None:
    (tmp_path / "empty.yaml").write_text("")
    result = abtune_main("train", str(tiny_config), "--launcher", str(tmp_path / "empty.yaml"))
    assert (result.returncode, result.stderr) == (
        2, f"abtune: error: {tmp_path / 'empty.yaml'}: the file is empty (or holds only comments); expected a YAML mapping\n")
    result = abtune_main("train", str(tiny_config), "--set", "train.steps=[3")
    assert (result.returncode, result.stderr) == (
        2, "abtune: error: --set train.steps:1:3: not valid YAML: expected ',' or ']', but got '<stream end>' "
           "(while parsing a flow sequence)\n")


@pytest.mark.slow  # a new Python through the installed command for each
@pytest.mark.parametrize("args", [["config", "show", "studies/run_quickstart.yaml"], ["study", "list"]])
def test_a_closed_output_pipe_ends_without_a_traceback(tmp_path: Path, args: list[str]) -> None:
    """`abtune ... | head -1`: the reader is gone before abtune writes (plain print and rich tables alike)."""
    root = Path(__file__).parent.parent
    storage = ["--storage", f"sqlite:///{tmp_path / 'o.db'}"] if args[0] == "study" else []
    if storage:  # a study to list, created in process: the command under test is the one that writes
        lifecycle.create(write_study(tmp_path / "s.yaml"), None, storage[1], force=False)
    read_end, write_end = os.pipe()
    os.close(read_end)
    process = subprocess.Popen([*abtune_command(), *args, *storage], stdout=write_end, stderr=subprocess.PIPE,
                               text=True, cwd=root)
    os.close(write_end)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1 and stderr == "", stderr


SECRET = "hunter2/s3cret"  # a slash too: generated passwords have them, and SQLAlchemy takes them as they are


@pytest.mark.parametrize(
    ("args", "echoed"),
    [
        (["study", "status", "tiny", "--storge", f"postgresql://me:{SECRET}@db/x"], "unrecognized arguments: --storge"),
        (["train", "run.yaml", f"--traking-uri=https://me:{SECRET}@mlflow.example.org"],
         "unrecognized arguments: --traking-uri=https://me:***@mlflow.example.org"),
        (["promote", "tiny", "--to", "t.yaml", "--scaling", f"postgresql://me:{SECRET}@db/x"],
         "argument --scaling: invalid choice: 'postgresql://me:***@db/x'"),
        (["promote", "tiny", "--to", "t.yaml", f"--s=postgresql://me:{SECRET}@db/x"], "ambiguous option: --s="),
        (["train", "run.yaml", "--set", f"postgresql://me:{SECRET}@db/x"],
         "--set 'postgresql://me:***@db/x': expected KEY=VALUE"),
    ],
    ids=["unrecognized", "unrecognized-joined", "invalid-choice", "ambiguous", "abtunes-own-error"],
)
def test_a_refused_argument_never_echoes_a_password(abtune_main: Callable[..., CliResult], args: list[str],
                                                    echoed: str) -> None:
    result = abtune_main(*args)
    assert result.returncode == 2
    assert echoed in result.stderr, result.stderr
    assert "hunter2" not in result.stdout + result.stderr and "s3cret" not in result.stdout + result.stderr


def test_a_postgresql_url_with_no_driver_installed_names_the_missing_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abtune_main: Callable[..., CliResult]) -> None:
    """Neither psycopg2 nor psycopg 3 importable (None in sys.modules: their import fails, as a missing package's)."""
    for driver in ("psycopg2", "psycopg"):
        monkeypatch.setitem(sys.modules, driver, None)
    url = "postgresql://me:s3cret@127.0.0.1:9/abtune"
    study, config = write_study(tmp_path / "s.yaml"), write_config(tmp_path / "run.yaml")
    for args in (["study", "create", str(study), "--storage", url],
                 ["train", str(config), "--tracking-uri", url, "--run-dir", str(tmp_path / "run")]):
        result = abtune_main(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr == ("abtune: error: postgresql://me:***@127.0.0.1:9/abtune: no PostgreSQL driver is "
                                 "installed (psycopg2 or psycopg); pip install 'abtune[postgres]'\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "optuna.db").exists()


def test_a_postgresql_url_names_the_installed_driver_and_any_other_stays_as_it_is() -> None:
    from abtune.databases import with_installed_driver

    # psycopg2 is what abtune[postgres] and abtune[dev] install
    for written in ("postgresql://me:pw@db:5432/x", "postgres://me:pw@db:5432/x"):  # libpq's and Heroku's spelling
        assert with_installed_driver(written) == "postgresql+psycopg2://me:pw@db:5432/x"
    for kept in ("postgresql+psycopg://me@db/x", "sqlite:////tmp/o.db", "journal:/tmp/j.log", "http://mlflow:5000"):
        assert with_installed_driver(kept) == kept


# --- folders abtune cannot write ----------------------------------------------------------------------------------
@pytest.fixture(params=["under a file", "in /proc", "on a read-only file system"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder that cannot be made: below a file, in /proc (root cannot either), on a read-only mount."""
    if request.param == "under a file":
        (tmp_path / "a-file").write_text("")
        yield tmp_path / "a-file" / "run"
    elif request.param == "in /proc":
        yield Path("/proc") / f"abtune-test-{os.getpid()}" / "run"
    else:
        mount = tmp_path / "read-only"
        mount.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(mount)]).returncode:
            pytest.skip("mounting a read-only tmpfs needs root")
        try:
            yield mount / "run"
        finally:
            subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_an_unwritable_run_folder_is_refused_in_one_line(tiny_config: Path, unwritable: Path, dry_run: bool,
                                                         abtune_main: Callable[..., CliResult]) -> None:
    result = abtune_main("train", str(tiny_config), "--nproc", "2", "--run-dir", str(unwritable), "--no-tracking",
                         *(["--dry-run"] if dry_run else []))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"abtune: error: --run-dir {unwritable}: "), result.stderr
    assert result.stderr.rstrip().endswith("choose a folder you can write"), result.stderr
    assert result.stdout == ""


def test_a_study_whose_folder_is_unwritable_stops_in_one_line_and_asks_no_trial(
        tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """`study run` and `study launch` (also --dry-run) check the study's folder before a trial is asked for:
    none is left RUNNING, and the study's waiting reference trials stay waiting."""
    (tmp_path / "a-file").write_text("")
    study_dir = tmp_path / "a-file" / "study"
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert abtune_main("study", "create", str(write_study(tmp_path / "s.yaml", study_dir=str(study_dir))),
                       "--storage", url).returncode == 0
    before = [(t.number, t.state) for t in trials_of(url)]
    for command in (["run", "tiny"], ["launch", "tiny", "--launcher", "slurm", "--dry-run"]):
        result = abtune_main("study", *command, "--storage", url, "--no-tracking", cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"abtune: error: study_dir {study_dir}: "), result.stderr
    assert [(t.number, t.state) for t in trials_of(url)] == before


def test_the_default_mlflow_store_in_a_folder_nobody_can_write_is_refused_in_one_line(
        tmp_path: Path, tiny_config: Path, abtune_main: Callable[..., CliResult]) -> None:
    """Run from /proc, the default store (./mlflow.db) cannot be made: one line that says what to do instead."""
    result = abtune_main("train", str(tiny_config), "--nproc", "2", "--run-dir", str(tmp_path / "run"),
                         cwd=Path("/proc"), env={"MLFLOW_TRACKING_URI": None})  # the default store
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("abtune: error: MLflow store /proc: cannot write /proc/mlflow.db.lock ("), result.stderr
    assert "pass --tracking-uri or --no-tracking" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_layout_that_does_not_fit_train_cluster_is_refused_before_anything_starts(
        tmp_path: Path, abtune_main: Callable[..., CliResult], dry_run: bool) -> None:
    """5 ranks a node on a cluster of 4 accelerators a node: refused in one line, not by rank 0 after the start-up."""
    config = write_config(tmp_path / "run.yaml", train={"cluster": "ethernet-25g"})
    result = abtune_main("train", str(config), "--nproc", "5", "--ranks-per-node", "5", "--run-dir",
                         str(tmp_path / "run"), "--no-tracking", *(["--dry-run"] if dry_run else []))
    assert (result.returncode, result.stderr, result.stdout) == (2, (
        "abtune: error: the run's 1 node(s) x 5 rank(s) do not fit cluster ethernet-25g (16 x 4); train it at a "
        "layout that fits\n"), "")
    assert not (tmp_path / "run").exists()


def test_the_command_a_hint_prints_keeps_every_option_and_no_password() -> None:
    from abtune.cli import _train_command, build_parser

    args = build_parser().parse_args(["train", "r.yaml", "--launcher", "emulated", "--nproc", "4", "--ranks-per-node",
                                      "2", "--set", "method.sigma_cutoff=0.2", "--tracking-uri",
                                      "https://me:s3cret@host:5000"])
    assert _train_command(args, Path("runs/my run")) == (
        "abtune train r.yaml --launcher emulated --nproc 4 --ranks-per-node 2 --run-dir 'runs/my run' --set "
        "method.sigma_cutoff=0.2 --tracking-uri 'https://me:***@host:5000' --resume")
