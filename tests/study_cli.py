"""`abtune ARGS` of the study tests in the test's own process (`abtune_main`), asserting that it succeeded as
`run_cli` does: a new Python per command costs seconds of CPU (start-up, imports of torch and Optuna) and adds
nothing where the test does not signal the command or read its exit from outside."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult, with_checkout_on_path


def in_process(abtune_main: Callable[..., CliResult], *args: str, cwd: Path | None = None,
               check: bool = True) -> CliResult:
    """`abtune ARGS` in this process, the checkout on PYTHONPATH (as run_cli gives it: the trials' ranks load the
    tests' hooks); with `check`, an exit code other than 0 fails the test with what the command printed."""
    path = with_checkout_on_path(os.environ)["PYTHONPATH"]
    result = abtune_main(*args, cwd=cwd, env={"PYTHONPATH": path})
    if check and result.returncode != 0:
        raise AssertionError(f"abtune {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
