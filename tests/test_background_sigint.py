"""Work started in the background (`nohup ... &`, a script's `&`) inherits SIGINT ignored and passes that on to
every process it starts: abtune's cancellation must not depend on it, and warm and cold ranks take a group
SIGINT alike (they leave it to their launcher, which stops them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from abtune.launch import warm
from abtune.launch.base import Layout
from abtune.launch.launchers import load_launcher
from abtune.launch.local import free_port, rank_environment
from abtune.training.hooks import read_metrics
from tests.conftest import abtune_command, wait_for, with_checkout_on_path, write_config

pytestmark = pytest.mark.slow  # trains


@contextmanager
def started_in_the_background() -> Iterator[None]:
    """What `nohup ... &` does to the processes this one starts meanwhile: SIGINT arrives ignored."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ignores_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


def _long_run(run_dir: Path) -> Path:
    run_dir.mkdir()
    write_config(run_dir / "config.yaml", train={"steps": 100_000, "log_every": 10})
    return run_dir


def test_a_local_job_started_with_sigint_ignored_is_cancelled(tmp_path: Path) -> None:
    run_dir = _long_run(tmp_path / "run")
    with started_in_the_background():
        job = load_launcher("local").submit(run_dir, Layout(1, 1))
    wait_for(lambda: read_metrics(run_dir), 300, "the run to train")
    assert ignores_sigint(int(job.job_id))  # its controller inherited the ignore
    job.cancel()
    outcome = wait_for(job.poll, 120, "the cancelled job's end")
    assert not outcome.ok and outcome.reason == f"local job {job.job_id} ended without a result (cancelled or killed)"


def test_warm_and_cold_ranks_leave_sigint_to_their_launcher(tmp_path: Path) -> None:
    """Whatever they inherit: a cold rank here starts with SIGINT at its default, a warm one is forked from a
    server; both ignore it once they run (their launcher stops them on Ctrl-C)."""
    runs = {"cold": _long_run(tmp_path / "cold"), "warm": _long_run(tmp_path / "warm")}
    cold = subprocess.Popen([sys.executable, "-m", warm.WORKER_MODULE, str(runs["cold"])],
                            env=rank_environment(0, 1, 1, free_port()))
    warm_rank = warm.spawn([str(runs["warm"])], rank_environment(0, 1, 1, free_port()))
    assert warm_rank is not None, "the session's warm server took no rank"
    ranks = {"cold": cold, "warm": warm_rank}
    try:
        for name, run_dir in runs.items():
            wait_for(lambda d=run_dir: read_metrics(d), 300, f"the {name} rank to train")
        assert {name: ignores_sigint(rank.pid) for name, rank in ranks.items()} == {"cold": True, "warm": True}
    finally:
        for rank in ranks.values():
            rank.terminate()
            rank.wait(60)


def test_a_command_started_with_sigint_ignored_stops_on_sigint(tmp_path: Path) -> None:
    """`kill -INT` (or a Ctrl-C that reaches it) stops `abtune train` as in a terminal, with the hint to continue."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", train={"steps": 100_000, "log_every": 10})
    with started_in_the_background():  # in pytest's session: its rank forks from the session's warm server
        process = subprocess.Popen([*abtune_command(), "train", str(config), "--run-dir", str(run_dir), "--no-tracking"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
                                   env=with_checkout_on_path(os.environ))
    try:
        wait_for(lambda: read_metrics(run_dir) if run_dir.is_dir() else None, 300, "the run to train")
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("abtune: interrupted"), stderr
