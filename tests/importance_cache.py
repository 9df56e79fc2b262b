"""Optuna's importances of one set of trials (fANOVA, seeded: the same parameters, values and objective give the
same numbers) computed once per test session, stored as JSON in one folder that the pytest-xdist workers and the
commands they start share: `study best` fits 40 forests for them (an objective's and 19 shufflings', twice),
seconds each time, and dozens of tests print the same stored study."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

FOLDER_VARIABLE = "ABTUNE_TESTS_IMPORTANCES"  # tests/terminal_site/sitecustomize.py reads it in a started command

Importances = Callable[[Any, Any, str], dict[str, float]]


def computed_once(compute: Importances, folder: Path) -> Importances:
    def once(trials: Any, values: Any, objective: str) -> dict[str, float]:
        key = repr((objective, [repr(v) for v in values],
                    [(list(t.params.items()), list(t.distributions.items())) for t in trials]))
        known = folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        if known.exists():
            return json.loads(known.read_text())
        # One computes, the others wait for its file: both workers reach the quickstart's importances within
        # seconds of each other at the start of a run, and would otherwise both spend ~10 s of CPU fitting them.
        with known.with_suffix(".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if known.exists():
                return json.loads(known.read_text())
            result = compute(trials, values, objective)
            written = known.with_suffix(f".{os.getpid()}")
            written.write_text(json.dumps(result))  # floats as repr writes them: read back exactly
            os.replace(written, known)  # whole or absent for a reader that does not wait on the lock
        return result

    return once


@contextmanager
def importances_computed_once(folder: Path) -> Iterator[None]:
    """`importance._importances_of` reads and writes `folder` meanwhile (the variable names it to commands)."""
    from abtune.study import importance

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importance, "_importances_of", computed_once(importance._importances_of, folder))
        patch.setenv(FOLDER_VARIABLE, str(folder))
        yield
