"""`abtune train --resume` is refused while the old launch of the run still trains, even after its
launcher was killed; a holder that died never blocks."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from abtune.errors import ConfigError
from abtune.runfiles import read_summary
from abtune.runlock import LOCK_FILE, claim_run, release_run
from abtune.training.hooks import hook_spec, read_metrics, write_hook_specs
from tests.conftest import abtune_command, run_cli, wait_for, with_checkout_on_path, write_config
from tests.gate import gate

HOST = socket.gethostname()
WAIT_S = 300  # a safety net for a hung run, never a pass/fail criterion
HOLD = "import sys; from abtune.runlock import join_run; held = join_run(__import__('pathlib').Path(sys.argv[1])); " \
       "print('held', flush=True); sys.stdin.read()"


def test_a_live_holder_refuses_the_claim_and_a_killed_one_does_not(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError) as refused:
            claim_run(tmp_path)
        assert str(refused.value) == (f"{tmp_path} is still training (rank 0 pid {holder.pid} on {HOST}); wait for it "
                                      "to end or stop it first, then resume: two trainings would write one run folder")
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK_FILE).read_text() == f"rank 0 pid {holder.pid} on {HOST}\n"  # stale, and harmless:
    claim_run(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == f"launcher pid {os.getpid()} on {HOST}\n"
    assert not _lock_free(tmp_path)  # held by this process until the launch ends
    release_run(tmp_path)
    assert _lock_free(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == ""  # a refusal names no launcher that is done


def test_a_run_claimed_by_a_relative_path_and_released_by_its_full_path_from_another_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's line comes out of the run's own run.lock, not out of a file of that name in the folder this
    process is in now (a relative path names another file there)."""
    (tmp_path / "first" / "run").mkdir(parents=True)
    (tmp_path / "then" / "run").mkdir(parents=True)
    (tmp_path / "then" / "run" / LOCK_FILE).write_text("somebody else's\n")
    monkeypatch.chdir(tmp_path / "first")
    claim_run(Path("run"))
    monkeypatch.chdir(tmp_path / "then")
    release_run(tmp_path / "first" / "run")
    assert _lock_free(tmp_path / "first" / "run")
    assert (tmp_path / "first" / "run" / LOCK_FILE).read_text() == ""
    assert (tmp_path / "then" / "run" / LOCK_FILE).read_text() == "somebody else's\n"


def test_a_released_launcher_leaves_rank_0_named_alone(tmp_path: Path) -> None:
    """A launch that let its run go while rank 0 trains (--detach, or a notebook's main() that returned): the
    refusal of a resume names rank 0, not the launcher, which may well be alive."""
    claim_run(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        release_run(tmp_path)
        with pytest.raises(ConfigError) as refused:
            claim_run(tmp_path)
        assert f"(rank 0 pid {holder.pid} on {HOST})" in str(refused.value)
    finally:
        release_run(tmp_path)  # none held once released: a failure before it must not hold the run for the session
        holder.kill()
        holder.wait()


def _lock_free(run_dir: Path) -> bool:
    with (run_dir / LOCK_FILE).open() as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@pytest.mark.slow  # trains twice
def test_a_finished_launch_lets_its_run_go_so_one_python_can_resume_it(tmp_path: Path, abtune_main_fd: Any) -> None:
    """`abtune.cli.main` twice in one Python (a notebook, the tests): the first launch held the run until the
    Python ended, so the resume was refused as 'still training (launcher pid <its own pid>)'."""
    config = write_config(tmp_path / "run.yaml", train={"steps": 8, "checkpoint_every": 4})
    run_dir = tmp_path / "run"
    assert abtune_main_fd("train", str(config), "--run-dir", str(run_dir), "--no-tracking").returncode == 0
    assert _lock_free(run_dir)
    resumed = abtune_main_fd("train", str(config), "--run-dir", str(run_dir), "--no-tracking", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {run_dir}/checkpoints/step_00000008 at step 8" in resumed.stdout
    assert _lock_free(run_dir)


@pytest.mark.slow
def test_resume_is_refused_while_the_old_ranks_run_and_the_first_run_finishes_untouched(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", train={"steps": 40, "log_every": 5, "eval_every": 20})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_hook_specs(run_dir, [hook_spec(gate, step=20)])
    train = [*abtune_command(), "train", str(config), "--nproc", "2", "--run-dir", str(run_dir), "--no-tracking"]
    # The ranks import the gate hook from this checkout's tests package, from a cwd outside it.
    env = with_checkout_on_path(os.environ)
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        # its own process group (the killpg below), in pytest's session (its ranks fork from the warm server)
        first = subprocess.Popen(train, cwd=tmp_path, stdout=log, stderr=log, process_group=0, env=env)
    try:
        wait_for(lambda: (run_dir / "gate.paused").exists() or _ended(first, log_path), WAIT_S, "rank 0 to reach step 20")
        config_before = (run_dir / "config.yaml").read_text()

        resumed = run_cli(*train[1:], "--resume", cwd=tmp_path, check=False, env=env)
        assert resumed.returncode == 2 and len(resumed.stderr.splitlines()) == 1, resumed.stderr
        assert f"is still training (launcher pid {first.pid} on {HOST}; rank 0 pid " in resumed.stderr

        os.kill(first.pid, signal.SIGKILL)  # the launcher only: its ranks keep training, as after a lost terminal
        first.wait()
        resumed = run_cli(*train[1:], "--resume", cwd=tmp_path, check=False, env=env)
        assert resumed.returncode == 2 and len(resumed.stderr.splitlines()) == 1, resumed.stderr
        assert "is still training (rank 0 pid " in resumed.stderr and "launcher" not in resumed.stderr

        (run_dir / "gate.go").touch()
        wait_for(lambda: _lock_free(run_dir), WAIT_S, "the orphaned ranks to finish")
    finally:
        if _group_alive(first.pid):  # a failed assertion must not leave ranks behind
            os.killpg(first.pid, signal.SIGKILL)
    summary = read_summary(run_dir).raw
    assert summary["steps_done"] == 40
    logged = [r["step"] for r in read_metrics(run_dir) if r["kind"] == "log"]
    assert logged == list(range(5, 41, 5))  # trained once: no step twice, none missing
    assert (run_dir / "config.yaml").read_text() == config_before
    assert not (run_dir / "failures").exists()
    claim_run(run_dir)  # the dead launcher's and rank 0's lines are still in the file; they block nothing


def _ended(process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is None:
        return False
    raise AssertionError(f"the first launch ended ({process.returncode}) before the gate:\n{log.read_text()}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
