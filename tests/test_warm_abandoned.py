"""A launcher that gives up waiting for the warm server's reply (a server still preloading on a busy
machine, past warm.REPLY_TIMEOUT_S) starts that rank cold: the server, answering late, must not run a
fork of it too. Such a fork, warm and so faster than the cold rank, took rank 0's rendezvous store and
trained with the other ranks; the cold rank 0 came later and waited for peers that had finished, until
the run's timeout."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abtune.config import load_run_config
from abtune.launch import local, warm
from abtune.rundir import prepare_run_dir
from abtune.runfiles import FAILURES_DIR, read_summary
from tests.conftest import write_config

WORKER_USAGE = "usage: abtune-worker"


@contextlib.contextmanager
def own_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A server of this test's own (not the session's), so that what it forked is all this test's;
    the block ends once the server and every rank it forked have ended."""
    for name in (warm.SOCKET_VARIABLE, warm.WARM_VARIABLE, warm.OWNER_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    with warm.owned_server(start=True, wait=True) as path:
        assert path is not None
        yield


def give_up_on_first_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first launcher times out just as its reply arrives: the server has forked the rank by then."""
    receive = socket.recv_fds
    replies = []

    def late(*args: Any, **kwargs: Any) -> Any:
        reply = receive(*args, **kwargs)
        replies.append(reply)
        if len(replies) == 1:
            for fd in reply[1]:
                os.close(fd)
            raise TimeoutError("timed out")
        return reply

    monkeypatch.setattr(socket, "recv_fds", late)


@pytest.mark.slow  # starts a warm server of its own, which imports torch, torchvision and the trainer
def test_a_rank_its_launcher_gave_up_on_never_runs(monkeypatch: pytest.MonkeyPatch,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    give_up_on_first_reply(monkeypatch)
    with own_server(monkeypatch):
        assert warm.spawn(["--help"], dict(os.environ)) is None  # its launcher starts it cold
        taken = warm.spawn(["--help"], dict(os.environ))
        assert taken is not None and taken.wait() == 0
    assert capfd.readouterr().out.count(WORKER_USAGE) == 1  # the rank taken, not the one given up on


@pytest.mark.slow
def test_a_run_whose_first_rank_starts_cold_after_a_late_reply_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    give_up_on_first_reply(monkeypatch)
    config = write_config(tmp_path / "run.yaml", train={"steps": 8, "pg_timeout_s": 20})
    run_dir = prepare_run_dir(load_run_config(config), tmp_path / "run", False)
    with own_server(monkeypatch):
        local.launch(run_dir, 2, 1)  # before: rank 0 failed, waiting 20 s for a peer that had finished
    assert read_summary(run_dir).steps_done == 8
    assert not (run_dir / FAILURES_DIR).exists()
