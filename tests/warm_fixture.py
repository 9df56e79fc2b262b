"""A warm rank server for tests that need ranks forked warm but not a server of their own: the session's
(tests/conftest.py; a fresh server imports torch, torchvision, the trainer and MLflow again, 6 s of CPU),
or, when the suite runs cold (ABTUNE_WARM_START=0), one started for the test."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from abtune.launch import warm


def session_server_serves() -> bool:
    return warm.enabled() and bool(os.environ.get(warm.SOCKET_VARIABLE))


@pytest.fixture
def warm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ranks launched in this test fork from a warm server: the session's, else one of this test's own
    (stopped, and waited for, at its end)."""
    if session_server_serves():
        warm.ensure_server()  # if no rank of the session has started it yet: the test's first rank then finds it
        yield
        return
    with owned_by_this_test(monkeypatch, start=True):
        yield


@contextlib.contextmanager
def owned_by_this_test(monkeypatch: pytest.MonkeyPatch, start: bool) -> Iterator[Path]:
    """This test owns the server its ranks fork from (none of the session's), started now with `start`, else on
    first use; at the end it is stopped and waited for. Yields its socket."""
    for name in (warm.SOCKET_VARIABLE, warm.WARM_VARIABLE, warm.OWNER_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    with warm.owned_server(start=start, wait=True) as path:
        assert path is not None
        yield path
