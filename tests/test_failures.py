"""A run that fails ends in one clear line, exit code 1, and the other ranks are stopped."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from abtune.runfiles import read_summary
from abtune.training.hooks import read_metrics, write_hook_specs
from tests.conftest import abtune_command, run_cli, wait_for, with_checkout_on_path, write_config
from tests.gate import gate_spec, paused, release

pytestmark = pytest.mark.slow


def test_nan_loss_stops_the_run_with_one_line(tmp_path: Path) -> None:
    """It fails before any checkpoint: the line offers no --resume, and a --resume is refused in one line instead of
    starting again at step 0 in the same folder."""
    config = write_config(tmp_path / "diverge.yaml", optimizer={"name": "sgd", "lr": 1e30, "momentum": 0.0})
    run = ("train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--no-tracking")
    result = run_cli(*run, check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "the loss became nan" in lines[0] and "lower optimizer.lr" in lines[0]
    assert lines[0].endswith(f"(run folder {tmp_path / 'run'}; no checkpoint to resume from)"), lines[0]
    assert "Traceback" not in result.stderr
    again = run_cli(*run, "--resume", check=False)
    assert (again.returncode, again.stderr) == (2, (
        f"abtune: error: --resume: {tmp_path / 'run'} holds no checkpoint to resume from (the run stopped before "
        "train.checkpoint_every wrote one); start it again without --resume in another --run-dir\n"))


def test_the_ctrl_c_hint_is_the_command_that_continues_the_run(tmp_path: Path) -> None:
    """Interrupted after its checkpoint at step 10, a run of 2 ranks with --set overrides prints the whole command,
    quoted; run as printed, it resumes at step 10 and ends. Interrupted before any checkpoint, it offers none."""
    config = write_config(tmp_path / "my run.yaml", train={"steps": 30, "checkpoint_every": 10})
    hints = []
    for gate_at, run_dir in ((20, tmp_path / "after checkpoint"), (5, tmp_path / "before")):
        run_dir.mkdir()
        write_hook_specs(run_dir, [gate_spec(gate_at)])  # rank 0 waits there: the Ctrl-C finds it mid-training
        command = [*abtune_command(), "train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir",
                   str(run_dir), "--set", "train.log_every=5", "--set", "model.arch=vit", "--no-tracking"]
        # in a process group of its own, as a terminal starts it; in pytest's session, so that its ranks fork
        # from the session's warm server (a command in a session of its own would start a server of its own)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=with_checkout_on_path(os.environ), process_group=0)
        wait_for(lambda d=run_dir, p=process: paused(d) or p.poll() is not None, 300, "rank 0 at the gate")
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        release(run_dir)
        assert process.returncode == 130, stderr
        hints.append(stderr.strip().splitlines()[-1])
    resume = (f"abtune train {shlex.quote(str(config))} --nproc 2 --ranks-per-node 1 --run-dir "
              f"{shlex.quote(str(tmp_path / 'after checkpoint'))} --set train.log_every=5 --set model.arch=vit "
              "--no-tracking --resume")
    assert hints == [f"abtune: interrupted; continue from step 10 with: {resume}",
                     f"abtune: interrupted before the run's first checkpoint; nothing to resume in {tmp_path / 'before'}"]
    resumed = subprocess.run([*abtune_command(), *shlex.split(resume)[1:]], capture_output=True, text=True,
                             timeout=300, env=with_checkout_on_path(os.environ))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 10" in resumed.stdout
    assert read_summary(tmp_path / "after checkpoint").raw["steps_done"] == 30


def _logged_steps(run_dir: Path) -> list[dict]:
    """What the run has logged so far, a record a logged step (a line being written is not one yet)."""
    try:
        return read_metrics(run_dir)
    except json.JSONDecodeError:
        return []


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


def _group_members(pid: int) -> list[int]:
    """Those in the process group that `pid` leads, but it: its ranks, cold (its children) or warm (forks of the
    warm server that joined its group)."""
    found = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(member) for member in found if int(member) != pid]


def _started_ranks(process: subprocess.Popen[str], count: int, written: Path,
                   ranks_of: Callable[[int], list[int]] = _children) -> list[int]:
    """The pids of the launcher's `count` ranks once they are started and `written` exists (cold ranks under
    load take a while: the timeout is a safety net, not what the test checks)."""
    started = wait_for(lambda: process.poll() is not None or (len(ranks := ranks_of(process.pid)) >= count
                                                             and written.exists() and ranks), 300, "the ranks")
    assert process.poll() is None, process.communicate()[1]
    return started


def test_killed_rank_stops_the_others_and_names_the_rank(tmp_path: Path) -> None:
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000})
    command = [*abtune_command(), "train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--no-tracking"]
    cold = {**os.environ, "ABTUNE_WARM_START": "0"}  # ranks as the launcher's children; warm: tests/test_warm.py
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cold)
    ranks = _started_ranks(process, 2, tmp_path / "run" / "config.yaml")
    wait_for(lambda: _logged_steps(tmp_path / "run") or process.poll() is not None, 300, "the ranks training")
    assert process.poll() is None, process.communicate()[1]
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert stderr.strip().splitlines()[-1].startswith("abtune: error: rank 1 was killed by SIGKILL")
    assert "Traceback" not in stderr  # the peer's crash in its next collective is in failures/, not on screen
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks), "every rank is stopped"


def test_a_frozen_rank_is_named_by_the_peer_that_noticed_it(tmp_path: Path) -> None:
    """SIGSTOP freezes rank 2 (node 1 of 2) as a hung GPU or a stalled node would: its peers wait for it in DDP's
    gradient all-reduce, and the first whose hang detector fires at its 3 s floor (gloo's timeout here is 600 s)
    names rank 2 and its node from what every rank last published in the rendezvous store, not itself; rank 3,
    alive on the same node, is not blamed."""
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000, "log_every": 5,
                                                         "hang": {"floor_s": 3, "untimed_s": 120}})
    command = [*abtune_command(), "train", str(config), "--nproc", "4", "--ranks-per-node", "2",
               "--run-dir", str(tmp_path / "run"), "--no-tracking"]
    # In a process group of its own, which its ranks join (warm ones too): a stopped process in pytest's process
    # group gets that whole group SIGHUP from the kernel once the group is orphaned (as under CI or setsid), here
    # when a warm rank of the test that runs beside this one (pytest-xdist) exits. In pytest's session, so that
    # the ranks fork from the session's warm server (a command in a session of its own starts a server of its own).
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=with_checkout_on_path(os.environ), process_group=0)
    ranks = _started_ranks(process, 4, tmp_path / "run" / "metrics.jsonl", _group_members)
    wait_for(lambda: len(_logged_steps(tmp_path / "run")) >= 2 or process.poll() is not None, 300, "steps timed")
    assert process.poll() is None, process.communicate()[1]
    os.kill(ranks[2], signal.SIGSTOP)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1 and stderr.count("\n") == 1, stderr
    line = stderr.strip()
    assert line.startswith("abtune: error: rank 2 (node 1) stopped responding: not heard from for "), line
    assert re.search(r"; rank [013] \(node [01]\) made no progress for \d+ s in step \d+ \(phase train\), not in a "
                     r"collective \(the last it issued: all_reduce over group 'world' of 4 ranks", line), line
    # the hang detector ended it at its bound (no wall-clock bound here: under load the machine sets that)
    assert re.search(r"the bound was \d+ s \((train.hang.floor_s 3 s|10 x its longest step)", line), line
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks), "every rank is stopped"
