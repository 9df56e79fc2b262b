"""A launcher that gives up waiting for the warm server's reply (a server still preloading on a busy
machine, past warm.REPLY_TIMEOUT_S) starts that rank cold: the server, answering late, must not run a
fork of it too. Such a fork, warm and so faster than the cold rank, took rank 0's rendezvous store and
trained with the other ranks; the cold rank 0 came later and waited for peers that had finished, until
the run's timeout."""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path
from typing import Any

import pytest

from abtune.config import load_run_config
from abtune.launch import local, warm
from abtune.rundir import prepare_run_dir
from abtune.runfiles import FAILURES_DIR, read_summary
from tests import warm_fixture
from tests.conftest import write_config

warm_server = warm_fixture.warm_server  # the session's server: what it forks meanwhile is this test's

WORKER_USAGE = "usage: abtune-worker"


def give_up_on_first_reply(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first launcher times out just as its reply arrives: the server has forked the rank by then.
    Returns, once given up, a pidfd of that fork (the launcher's is closed), to wait for its end."""
    receive = socket.recv_fds
    replies = []
    given_up: list[int] = []

    def late(*args: Any, **kwargs: Any) -> Any:
        reply = receive(*args, **kwargs)
        replies.append(reply)
        if len(replies) == 1:
            given_up.extend(os.dup(fd) for fd in reply[1])
            for fd in reply[1]:
                os.close(fd)
            raise TimeoutError("timed out")
        return reply

    monkeypatch.setattr(socket, "recv_fds", late)
    return given_up


def wait_until_ended(pidfds: list[int]) -> None:
    """Until each process of `pidfds` (a pidfd turns readable when its process ends) has ended."""
    for pidfd in pidfds:
        try:
            assert select.select([pidfd], [], [], 120)[0], "the fork given up on still runs after 120 s"
        finally:
            os.close(pidfd)


@pytest.mark.slow  # forks from a warm server (a fresh one imports torch, torchvision and the trainer)
def test_a_rank_its_launcher_gave_up_on_never_runs(warm_server: None, monkeypatch: pytest.MonkeyPatch,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    given_up = give_up_on_first_reply(monkeypatch)
    assert warm.spawn(["--help"], dict(os.environ)) is None  # its launcher starts it cold
    assert len(given_up) == 1  # the fork's pidfd: the server had forked it
    taken = warm.spawn(["--help"], dict(os.environ))
    assert taken is not None and taken.wait() == 0
    wait_until_ended(given_up)
    assert capfd.readouterr().out.count(WORKER_USAGE) == 1  # the rank taken, not the one given up on


@pytest.mark.slow
def test_a_run_whose_first_rank_starts_cold_after_a_late_reply_finishes(
        tmp_path: Path, warm_server: None, monkeypatch: pytest.MonkeyPatch) -> None:
    give_up_on_first_reply(monkeypatch)
    config = write_config(tmp_path / "run.yaml", train={"steps": 8, "pg_timeout_s": 20})
    run_dir = prepare_run_dir(load_run_config(config), tmp_path / "run", False)
    local.launch(run_dir, 2, 1)  # before: rank 0 failed, waiting 20 s for a peer that had finished
    assert read_summary(run_dir).steps_done == 8
    assert not (run_dir / FAILURES_DIR).exists()
