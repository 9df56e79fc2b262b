"""Optuna's importances of one set of trials (fANOVA, seeded: the same parameters, values and objective give the
same numbers) computed once per test session, stored as JSON in one folder that the pytest-xdist workers and the
commands they start share: `study best` fits 40 forests for them (an objective's and 19 shufflings', twice),
seconds each time, and dozens of tests print the same stored study.

The folder starts with the fits recorded in tests/fixtures/importances.json (every fit the fast tier makes, about
100 forests: 20 of its 165 CPU-s), so a session fits only what is not recorded. The whole suite checks each recorded
fit against what Optuna computes here (tests/test_importance_uncertainty.py). A recording made by other code of
`importance._importances_of` or other releases of Optuna or scikit-learn is not read. After a change to what the
tests fit, to that code or to those releases, record them again: `ABTUNE_TESTS_RECORD_IMPORTANCES=1 pytest -q -m
"not slow"` (recording some tests only adds their fits; to drop fits no test makes any more, delete the file first)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

FOLDER_VARIABLE = "ABTUNE_TESTS_IMPORTANCES"  # tests/terminal_site/sitecustomize.py reads it in a started command
RECORD_VARIABLE = "ABTUNE_TESTS_RECORD_IMPORTANCES"  # set: every fit made afresh, and the session's become RECORDING
RECORDING = Path(__file__).resolve().parent / "fixtures" / "importances.json"

Importances = Callable[[Any, Any, str], dict[str, float]]


def computed_once(compute: Importances, folder: Path) -> Importances:
    @functools.wraps(compute)  # its __wrapped__: the fit itself (fitted_now)
    def once(trials: Any, values: Any, objective: str) -> dict[str, float]:
        inputs = _inputs(trials, values, objective)
        known = folder / f"{key_of(inputs)}.json"
        if known.exists():
            return json.loads(known.read_text())["result"]
        # One computes, the others wait for its file: both workers reach the quickstart's importances within
        # seconds of each other at the start of a run, and would otherwise both spend ~10 s of CPU fitting them.
        with known.with_suffix(".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if known.exists():
                return json.loads(known.read_text())["result"]
            result = compute(trials, values, objective)
            _write_whole(known, {"inputs": inputs, "result": result})
        return result

    return once


def _inputs(trials: Any, values: Any, objective: str) -> dict[str, Any]:
    """All that a fit reads (`importance._importances_of`), as JSON: each trial's parameters and distributions,
    the values, the objective."""
    from optuna.distributions import distribution_to_json

    return {"objective": objective, "values": [float(v) for v in values],
            "trials": [{"params": dict(t.params),
                        "distributions": {n: distribution_to_json(d) for n, d in t.distributions.items()}}
                       for t in trials]}


def key_of(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def fitted_now(inputs: dict[str, Any]) -> dict[str, float]:
    """The fit of recorded `inputs` as Optuna computes it here, no cache."""
    from optuna.distributions import json_to_distribution
    from optuna.trial import create_trial

    from abtune.study import importance

    fit = inspect.unwrap(importance._importances_of)
    trials = [create_trial(params=t["params"], value=0.0,
                           distributions={n: json_to_distribution(d) for n, d in t["distributions"].items()})
              for t in inputs["trials"]]
    return fit(trials, inputs["values"], inputs["objective"])


def made_by() -> dict[str, str]:
    """What a fit depends on besides its inputs: the code of `_importances_of` and the releases it calls. A recording
    made by anything else is not read (and the whole suite's check of it fails)."""
    import optuna
    import sklearn

    from abtune.study import importance

    fit = inspect.unwrap(importance._importances_of)
    return {"fit": hashlib.sha256(inspect.getsource(fit).encode()).hexdigest()[:16],
            "optuna": optuna.__version__, "scikit-learn": sklearn.__version__}


def _stored() -> dict[str, Any]:
    return json.loads(RECORDING.read_text()) if RECORDING.exists() else {"fits": {}}


def recorded(stored: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each recorded fit by its key: {"inputs", "result"}. The file holds each set of trials once (the 40 fits of
    one study share theirs) and, per fit, its set's key, objective, values and result (most important first, as
    Optuna orders it)."""
    stored = _stored() if stored is None else stored
    return {key: {"inputs": {"objective": fit["objective"], "values": fit["values"],
                             "trials": stored["trials"][fit["trials"]]}, "result": fit["result"]}
            for key, fit in stored["fits"].items()}


def recorded_by() -> dict[str, str] | None:
    return _stored().get("made_by")


def _write_whole(path: Path, content: Any, indent: int | None = None) -> None:
    """Whole or absent for a reader that does not wait on a lock. Keys in the order given: a result's order is
    Optuna's ranking."""
    written = path.with_suffix(f".{os.getpid()}")
    written.write_text(json.dumps(content, indent=indent) + "\n")
    os.replace(written, path)


def _readable(stored: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The recorded fits, when this code and these releases made them; else none (a session fits them afresh)."""
    return recorded(stored) if stored.get("made_by") == made_by() else {}


def seed(folder: Path) -> None:
    """`folder` starts with the recorded fits, when the recording was made by this code and these releases."""
    for key, entry in _readable(_stored()).items():
        if not (folder / f"{key}.json").exists():
            _write_whole(folder / f"{key}.json", entry)


def _record(folder: Path) -> None:
    """This session's fits join the recording (each worker writes the whole folder: the same entries). Recorded fits
    the session did not make stay when the same code and releases made them (a session of some tests only must not
    drop the rest), and go when they did not (they would not be read)."""
    with (folder / "recording.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = _readable(_stored())
        entries.update({path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")})
        trials: dict[str, Any] = {}
        fits: dict[str, Any] = {}
        for key, entry in sorted(entries.items()):
            inputs = entry["inputs"]
            set_key = key_of(inputs["trials"])[:16]
            trials[set_key] = inputs["trials"]
            fits[key] = {"trials": set_key, "objective": inputs["objective"], "values": inputs["values"],
                         "result": entry["result"]}
        _write_whole(RECORDING, {"made_by": made_by(), "trials": dict(sorted(trials.items())), "fits": fits},
                     indent=0)


@contextmanager
def importances_computed_once(folder: Path) -> Iterator[None]:
    """`importance._importances_of` reads and writes `folder` meanwhile (the variable names it to commands); the
    folder starts with the recorded fits."""
    from abtune.study import importance

    recording = bool(os.environ.get(RECORD_VARIABLE))
    if not recording:  # recording, every fit is made afresh
        seed(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importance, "_importances_of", computed_once(importance._importances_of, folder))
        patch.setenv(FOLDER_VARIABLE, str(folder))
        yield
    if recording:
        _record(folder)
