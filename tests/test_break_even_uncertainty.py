"""A break-even or "faster at every rate" only where the predicted gap exceeds the model's stated uncertainty
(abtune/timing.py `separation`, `UNCERTAINTY`; the words: abtune/compare.py `separation_words`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from abtune import timing
from abtune.compare import separation_words
from abtune.timing import ComputeSource, Prediction, load_cluster, separation

CLUSTER = load_cluster("paper-a100-hdr200")


def run(seconds_at: Callable[[float], float], kind: str) -> dict[str, Any]:
    """A stand-in summary whose predicted training seconds are a function of the inter-node rate."""
    return {"seconds_at": seconds_at, "kind": kind}


@pytest.fixture(autouse=True)
def stand_in_predictions(monkeypatch: pytest.MonkeyPatch) -> None:
    def predict(summary: dict[str, Any], cluster: timing.Cluster) -> Prediction:
        seconds = summary["seconds_at"](cluster.inter_node.gbit_per_s)
        return Prediction(cluster.name, {}, {}, 0.0, seconds, None, ComputeSource(summary["kind"], "test"), 0.0)
    monkeypatch.setattr(timing, "predict", predict)


def words(ab: dict[str, Any], ddp: dict[str, Any]) -> str:
    return separation_words(CLUSTER, "with test compute", separation(ab, ddp, CLUSTER), "ab")


def test_a_gap_of_a_third_of_a_percent_under_assumed_compute_is_not_a_faster_method() -> None:
    said = words(run(lambda rate: 100.0, "assumed"), run(lambda rate: 100.3, "assumed"))
    assert "within the model's uncertainty (±50%) at every inter-node rate" in said
    assert "faster at every" not in said and "equals" not in said


def test_a_gap_beyond_the_uncertainty_at_every_rate_is_still_faster_at_every_rate() -> None:
    said = words(run(lambda rate: 60.0, "published"), run(lambda rate: 100.0, "published"))
    assert said.endswith("ab is predicted faster at every inter-node rate from 0.01 to 10,000 Gbit/s")


def test_a_crossing_names_the_break_even_and_the_band_the_model_cannot_tell() -> None:
    # ab: 100 s whatever the link; ddp: link-bound, 100 s at 10 Gbit/s, 10x slower at 1, 10x faster at 100
    ddp = run(lambda rate: 100.0 * 10 / rate, "published")
    said = words(run(lambda rate: 100.0, "published"), ddp)
    assert "ab's predicted training time equals ddp's at 10 Gbit/s per node" in said
    assert "ab is predicted faster from 0.01 to 5.62 Gbit/s" in said  # 10/5.62 = 1.78: beyond 15%
    assert "ddp is predicted faster from 17.8 to 1e+04 Gbit/s" in said
    assert "in between they are within the model's uncertainty (±15%)" in said


def test_a_crossing_inside_the_uncertainty_is_not_called_a_break_even() -> None:
    said = words(run(lambda rate: 100.0, "assumed"), run(lambda rate: 100.0 + (1 if rate > 10 else -1), "assumed"))
    assert timing.break_even_gbit(run(lambda rate: 100.0, "assumed"),
                                  run(lambda rate: 100.0 + (1 if rate > 10 else -1), "assumed"), CLUSTER) is not None
    assert "equals" not in said and "neither is predicted faster, and no break-even is claimed" in said


def test_the_less_certain_prediction_sets_the_uncertainty() -> None:
    seen = separation(run(lambda rate: 100.0, "measured"), run(lambda rate: 125.0, "scaled"), CLUSTER)
    assert seen.uncertainty == timing.UNCERTAINTY["scaled"] == 0.30
    assert seen.method_faster is None and seen.ddp_faster is None  # 20% apart, inside 30%
