"""The statistics of repeated runs: mean, spread, a 95% interval and a paired test between configurations.

Intervals are Student-t intervals (mean +- t(0.975, n-1) * std / sqrt(n), std with ddof=1). Two
configurations run with the same seeds are compared with a paired t-test over those seeds
(`scipy.stats.ttest_rel`, two-sided): pairing removes the part of the noise the seed explains
(data order, initialization) that both configurations share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
ALPHA = 1.0 - LEVEL
TEST_NAME = "paired t-test over shared seeds (scipy.stats.ttest_rel, two-sided, alpha 0.05)"


@dataclass(frozen=True)
class Spread:
    """Mean, sample std and the 95% t-interval of n values (std and interval are nan for n = 1)."""

    n: int
    mean: float
    std: float
    low: float
    high: float


@dataclass(frozen=True)
class Paired:
    """`a - b` over shared seeds: the mean difference, the t statistic, its p-value and the verdict."""

    n: int
    diff: float
    t: float
    p: float

    @property
    def significant(self) -> bool:
        return self.p < ALPHA


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); nan for fewer than two values."""
    if len(values) < 2:
        return math.nan
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (len(values) - 1))


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    centre, deviation = mean(values), std(values)
    if len(values) < 2 or not math.isfinite(centre):
        return Spread(len(values), centre, deviation, math.nan, math.nan)
    from scipy.stats import t as student

    half = float(student.ppf(1.0 - ALPHA / 2, len(values) - 1)) * deviation / math.sqrt(len(values))
    return Spread(len(values), centre, deviation, centre - half, centre + half)


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Paired t-test of a against b (same seeds, same order). Differences without spread (the same
    bytes every seed) are exact: p is 0 when they differ, 1 when they are equal."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired test needs two equally long lists of at least 2 values, got {len(a)} and {len(b)}")
    differences = [x - y for x, y in zip(a, b, strict=True)]
    diff = mean(differences)
    if not math.isfinite(diff):
        return Paired(len(a), diff, math.nan, math.nan)
    if std(differences) <= 1e-12 * max(1.0, abs(diff)):
        return Paired(len(a), diff, math.copysign(math.inf, diff) if diff else 0.0, 0.0 if diff else 1.0)
    from scipy.stats import ttest_rel

    result = ttest_rel(a, b)
    return Paired(len(a), diff, float(result.statistic), float(result.pvalue))
