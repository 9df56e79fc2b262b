"""The statistics of repeats against hand computations."""

from __future__ import annotations

import math

import pytest

from abtune.study import stats


def test_spread_is_the_t_interval() -> None:
    values = [0.90, 0.92, 0.94]
    result = stats.spread(values)
    # mean 0.92; deviations -0.02, 0, 0.02 -> variance 0.0008 / 2 = 0.0004, std 0.02;
    # t(0.975, 2) = 4.302653; half width 4.302653 * 0.02 / sqrt(3) = 0.0496827
    assert result.mean == pytest.approx(0.92, abs=1e-15)
    assert result.std == pytest.approx(0.02, rel=1e-12)
    assert result.low == pytest.approx(0.92 - 0.0496827, abs=1e-7)
    assert result.high == pytest.approx(0.92 + 0.0496827, abs=1e-7)
    single = stats.spread([0.5])
    assert single.mean == 0.5 and math.isnan(single.std) and math.isnan(single.low)


def test_paired_t_statistic_by_hand() -> None:
    a, b = [0.95, 0.96, 0.93, 0.97], [0.94, 0.94, 0.93, 0.95]
    # differences 0.01, 0.02, 0.00, 0.02: mean 0.0125, std sqrt((0.0025^2+0.0075^2+0.0125^2+0.0075^2)/3)
    d_std = math.sqrt((0.0025**2 + 0.0075**2 + 0.0125**2 + 0.0075**2) / 3)
    t = 0.0125 / (d_std / math.sqrt(4))
    result = stats.paired(a, b)
    assert result.diff == pytest.approx(0.0125, abs=1e-12)
    assert result.t == pytest.approx(t, rel=1e-9)  # 2.611...
    assert result.p == pytest.approx(0.0797, abs=5e-4)  # two-sided, 3 degrees of freedom
    assert not result.significant


def test_differences_without_spread_are_exact() -> None:
    assert stats.paired([10.0, 10.0], [4.0, 4.0]) == stats.Paired(2, 6.0, math.inf, 0.0)
    assert not stats.paired([10.0, 10.0], [4.0, 4.0]).significant  # exact: a fact, not a significance test
    assert stats.paired([10.0, 10.0], [4.0, 4.0]).verdict(maximize=False) == stats.WORSE
    assert stats.paired([3.0, 5.0], [3.0, 5.0]).p == 1.0
    with pytest.raises(ValueError):
        stats.paired([1.0], [2.0])
