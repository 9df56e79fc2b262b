"""Importances carry their uncertainty: a p-value against shuffled objective values, and "indistinguishable"
when no parameter beats the shuffles (the quickstart's 7 trials), while a parameter that drives top-1 does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.study import importance
from tests import importance_cache
from tests.importance_cache import (
    RECORD_VARIABLE,
    computed_once,
    fitted_now,
    made_by,
    recorded,
    recorded_by,
    seed,
)
from tests.quickstart_fixture import SPACE, quickstart_trials

OBJECTIVES = ["top1", "inter_node_bytes"]


def test_seven_quickstart_trials_rank_no_parameter() -> None:
    report = importance.analysis(quickstart_trials(), list(SPACE), OBJECTIVES)
    assert report["permutations"] == 19
    p_values = report["p_values"]
    assert set(p_values) == set(OBJECTIVES)
    assert all(0.05 < p <= 1.0 for by_param in p_values.values() for p in by_param.values()), p_values


def test_a_parameter_that_drives_top1_beats_every_shuffle() -> None:
    space = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.ab_frac": FloatDistribution(0.01, 0.1)}
    trials = []
    for i in range(12):
        warmup, ab = round(0.1 + 0.2 * i / 11, 6), round(0.01 + 0.09 * ((i * 5) % 12) / 11, 6)
        trials.append(create_trial(params={"method.warmup_frac": warmup, "method.ab_frac": ab}, distributions=space,
                                   values=[0.5 + warmup, 1e6], user_attrs={"top1": 0.5 + warmup, "inter_node_bytes": 1e6}))
    report = importance.analysis(trials, list(space), ["top1"])
    assert report["p_values"]["top1"]["method.warmup_frac"] == 0.05  # above all 19 shuffles: (1 + 0) / 20
    assert report["p_values"]["top1"]["method.ab_frac"] > 0.05


RECORD_AGAIN = f"record them again with `{RECORD_VARIABLE}=1 pytest -q -m \"not slow\"`"


def test_the_quickstart_s_fits_are_read_from_the_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast tier fits no importance the recording holds: a change to what the tests fit, to `_importances_of` or
    to Optuna or scikit-learn that leaves the recording unread fails here, not as a slower fast tier."""
    if os.environ.get(RECORD_VARIABLE):
        pytest.skip("the recording is being made")
    assert recorded_by() == made_by(), f"the recording was made by {recorded_by()}, this is {made_by()}: {RECORD_AGAIN}"

    def never(*args: object) -> dict[str, float]:
        raise AssertionError(f"a quickstart fit that is not recorded: {RECORD_AGAIN}")

    seed(tmp_path)
    monkeypatch.setattr(importance, "_importances_of", computed_once(never, tmp_path))
    assert importance.analysis(quickstart_trials(), list(SPACE), OBJECTIVES)["p_values"]


def _fit(folder: Path, objective: str, result: dict[str, float]) -> str:
    """One fit as a session's folder holds it; its key."""
    inputs = {"objective": objective, "values": [0.5, 0.7],
              "trials": [{"params": {"x": 0.1}, "distributions": {}}, {"params": {"x": 0.2}, "distributions": {}}]}
    key = importance_cache.key_of(inputs)
    (folder / f"{key}.json").write_text(json.dumps({"inputs": inputs, "result": result}))
    return key


def test_recording_some_tests_adds_their_fits_and_keeps_the_rest(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Record mode on a subset of the tests replaced the whole recording with the subset's fits."""
    monkeypatch.setattr(importance_cache, "RECORDING", tmp_path / "importances.json")
    first, then = tmp_path / "first", tmp_path / "then"
    first.mkdir()
    then.mkdir()
    kept = _fit(first, "top1", {"x": 1.0})
    importance_cache._record(first)
    added = _fit(then, "inter_node_bytes", {"x": 0.5})
    importance_cache._record(then)
    assert {key: entry["result"] for key, entry in recorded().items()} == {kept: {"x": 1.0}, added: {"x": 0.5}}

    stale = json.loads(importance_cache.RECORDING.read_text())
    stale["made_by"]["optuna"] = "0.0.0"  # fits another release made are not read, so they are not kept either
    importance_cache.RECORDING.write_text(json.dumps(stale))
    importance_cache._record(then)
    assert list(recorded()) == [added] and recorded_by() == made_by()


@pytest.mark.slow  # every recorded fit again: about 100 forests, 20 s of CPU
def test_every_recorded_fit_is_what_optuna_fits_here() -> None:
    """The fast tier reads its importances from tests/fixtures/importances.json (tests/importance_cache.py); here
    each is fitted again, uncached, and must give the recorded numbers in the recorded order (Optuna's ranking)."""
    entries = recorded()
    assert len(entries) >= 40  # the quickstart's, at least
    stale = []
    for key, entry in entries.items():
        fitted = fitted_now(entry["inputs"])
        if list(fitted) != list(entry["result"]) or fitted != pytest.approx(entry["result"], rel=1e-9, abs=1e-12):
            stale.append(f"{key[:12]}: recorded {entry['result']}, fitted now {fitted}")
    assert not stale, f"{len(stale)} of {len(entries)} recorded fits differ from Optuna's here; {RECORD_AGAIN}:\n" + \
        "\n".join(stale[:3])
