"""The shuffled baseline of the importances fits each order of the objective's values once: three search trials
(a tiny study's) have six orders, and 19 shufflings repeat them; a repeat reuses the seeded fit, so the p-values
are those of fitting every shuffling (tests/test_importance_uncertainty.py checks them on real fits)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, create_trial

from abtune.study import importance

SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.ab_frac": FloatDistribution(0.01, 0.1)}
TOP1 = [0.93, 0.95, 0.97]


def _trials() -> list[FrozenTrial]:
    return [create_trial(params={"method.warmup_frac": (0.1, 0.2, 0.3)[i], "method.ab_frac": 0.05}, distributions=SPACE,
                         values=[top1, 1e6], user_attrs={"top1": top1, "inter_node_bytes": 1e6})
            for i, top1 in enumerate(TOP1)]


def _credit(values: Sequence[float]) -> dict[str, float]:
    """A stand-in for the seeded evaluator: a fixed function of the values in their order."""
    return {"method.warmup_frac": values[0] / sum(values), "method.ab_frac": values[-1] / sum(values)}


def test_a_shuffling_that_repeats_an_earlier_one_is_not_fitted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fitted: list[tuple[float, ...]] = []

    def fit(trials: Sequence[FrozenTrial], values: Sequence[float], objective: str) -> dict[str, float]:
        fitted.append(tuple(values))
        return _credit(values)

    monkeypatch.setattr(importance, "_importances_of", fit)
    observed = {"top1": {"method.warmup_frac": 0.33, "method.ab_frac": 0.34}}
    p_values = importance.against_shuffled(_trials(), observed)
    assert len(fitted) == len(set(fitted)) <= 6, fitted  # each order of three values once, not 19 fits

    shuffle, orders = random.Random(0).shuffle, []
    for _ in range(importance.PERMUTATIONS):  # every shuffling fitted, as the baseline is defined
        order = list(TOP1)
        shuffle(order)
        orders.append(order)
    assert set(fitted) == {tuple(o) for o in orders}
    expected = {param: (1 + sum(_credit(o)[param] >= value for o in orders)) / (1 + importance.PERMUTATIONS)
                for param, value in observed["top1"].items()}
    assert p_values == {"top1": expected}
