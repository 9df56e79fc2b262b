"""`abtune ARGS` in the test's own process (torch imported once), its output captured: the `cli` fixture."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from abtune.cli import main


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """`abtune ARGS` in this process (importing torch once); the entry point itself is tested by the dry run.
    At run_cli's 200 columns, whatever an earlier test in this process left in the environment."""
    monkeypatch.setenv("COLUMNS", "200")
    for forcing in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(forcing, raising=False)
    def run(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)
    return run
