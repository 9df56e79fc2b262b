"""A run that fails ends in one clear line, exit code 1, and the other ranks are stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import abtune_command, run_cli, write_config

pytestmark = pytest.mark.slow


def test_nan_loss_stops_the_run_with_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "diverge.yaml", optimizer={"name": "sgd", "lr": 1e30, "momentum": 0.0})
    result = run_cli("train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--no-tracking",
                     check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "the loss became nan" in lines[0] and "lower optimizer.lr" in lines[0]
    assert "Traceback" not in result.stderr


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


def test_killed_rank_stops_the_others_and_names_the_rank(tmp_path: Path) -> None:
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000})
    command = [*abtune_command(), "train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--no-tracking"]
    cold = {**os.environ, "ABTUNE_WARM_START": "0"}  # ranks as the launcher's children; warm: tests/test_warm.py
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cold)
    deadline = time.monotonic() + 120
    while len(ranks := _children(process.pid)) < 2 or not (tmp_path / "run" / "config.yaml").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.2)
    time.sleep(8)  # let the ranks get into training
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert stderr.strip().splitlines()[-1].startswith("abtune: error: rank 1 was killed by SIGKILL")
    assert "Traceback" not in stderr  # the peer's crash in its next collective is in failures/, not on screen
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks), "every rank is stopped"


FROZEN_BOUND_S = 60  # the 3 s floor, the launcher's settle and grace (a stopped rank ignores SIGTERM), a loaded machine


def test_a_frozen_rank_is_named_by_the_peer_that_noticed_it(tmp_path: Path) -> None:
    """SIGSTOP freezes rank 2 (node 1 of 2) as a hung GPU or a stalled node would: its peers wait for it in DDP's
    gradient all-reduce, and the first whose hang detector fires at its 3 s floor (gloo's timeout here is 600 s)
    names rank 2 and its node from what every rank last published in the rendezvous store, not itself; rank 3,
    alive on the same node, is not blamed."""
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000, "log_every": 5,
                                                         "hang": {"floor_s": 3, "untimed_s": 120}})
    command = [*abtune_command(), "train", str(config), "--nproc", "4", "--ranks-per-node", "2",
               "--run-dir", str(tmp_path / "run"), "--no-tracking"]
    cold = {**os.environ, "ABTUNE_WARM_START": "0"}  # ranks as the launcher's children
    # In a session of its own: a stopped process in pytest's process group gets that whole group SIGHUP from
    # the kernel once the group is orphaned (as under CI or setsid), here when a warm rank of the test that
    # runs beside this one (pytest-xdist) exits.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cold,
                               start_new_session=True)
    deadline = time.monotonic() + 120
    while len(ranks := _children(process.pid)) < 4 or not (tmp_path / "run" / "metrics.jsonl").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.2)
    time.sleep(2)  # some steps timed
    os.kill(ranks[2], signal.SIGSTOP)
    frozen = time.monotonic()
    _, stderr = process.communicate(timeout=300)
    took = time.monotonic() - frozen
    assert process.returncode == 1 and stderr.count("\n") == 1, stderr
    line = stderr.strip()
    assert line.startswith("abtune: error: rank 2 (node 1) made no progress for "), line
    assert re.search(r"; rank [013] \(node [01]\) waited \d+ s in step \d+ \(phase train\), not in a collective "
                     r"\(the last it issued: all_reduce over group 'world' of 4 ranks", line), line
    assert re.search(r"the bound was \d+ s \((train.hang.floor_s 3 s|10 x its longest step)", line), line
    assert took < FROZEN_BOUND_S, took
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks), "every rank is stopped"
