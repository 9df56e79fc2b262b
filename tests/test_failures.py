"""A run that fails ends in one clear line, exit code 1, and the other ranks are stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import abtune_command, run_cli, write_config

pytestmark = pytest.mark.slow


def test_nan_loss_stops_the_run_with_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "diverge.yaml", optimizer={"name": "sgd", "lr": 1e30, "momentum": 0.0})
    result = run_cli("train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run"), check=False)
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
    command = [*abtune_command(), "train", str(config), "--nproc", "2", "--run-dir", str(tmp_path / "run")]
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
