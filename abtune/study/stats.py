"""The statistics of repeated runs: mean, spread, a 95% interval and a paired test between configurations,
each knowing the size of its sample.

Intervals are Student-t intervals (mean +- t(0.975, n-1) * std / sqrt(n), std with ddof=1), given from
MIN_SEEDS seeds on (two seeds give one degree of freedom: an interval wider than the scale). A top-1 is
a share of validation images, so its interval is also bounded to [0, 1]: the Wilson score interval over
the images pooled across seeds (what scoring a finite validation set alone leaves open), widened to the
seeds' t-interval where there is one. Values that were the same in every seed (traffic is deterministic)
are exact, not an interval of zero width.

Two configurations run with the same seeds are compared with a paired t-test over those seeds
(`scipy.stats.ttest_rel`, two-sided): pairing removes the part of the noise the seed explains (data
order, initialization) that both configurations share. A difference is called significant only from
MIN_SEEDS seeds and a measured spread; the verdict is said in words (better, worse, cannot tell), with
the seeds a difference of one margin would need, from the measured seed-to-seed spread of the
differences (normal approximation, 80% power at alpha 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
ALPHA = 1.0 - LEVEL
MIN_SEEDS = 3  # fewer: no interval from the seeds, no significance
POWER = 0.8  # of the seeds-needed estimate
BETTER, WORSE, CANNOT_TELL, SAME = "better", "worse", "cannot tell", "the same"
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
        """A difference the seeds can tell: from MIN_SEEDS seeds with a spread (never from an exact difference)."""
        return self.n >= MIN_SEEDS and math.isfinite(self.t) and self.p < ALPHA

    @property
    def exact(self) -> bool:
        """Every seed gave the same difference: a fact of the configurations, not a sample."""
        return math.isinf(self.t) or (self.t == 0.0 and self.p == 1.0)

    def verdict(self, maximize: bool) -> str:
        """better, worse, the same or cannot tell, for a metric whose higher values are better when `maximize`."""
        if self.exact:
            return SAME if self.diff == 0 else BETTER if (self.diff > 0) == maximize else WORSE
        if not self.significant:
            return CANNOT_TELL
        return BETTER if (self.diff > 0) == maximize else WORSE


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


def wilson(share: float, trials: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion `share` observed over `trials` (within [0, 1])."""
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - ALPHA / 2))
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def interval(values: Sequence[float], images: int | None = None) -> tuple[float, float]:
    """The 95% interval of the mean of `values` as the sample allows (see the module); nan when it does not.
    `images`: the values are top-1 shares of that many validation images each."""
    result = spread(values)
    seeds = (result.low, result.high) if len(values) >= MIN_SEEDS and result.std > 0 else (math.nan, math.nan)
    if images is None or not math.isfinite(result.mean):
        return seeds
    low, high = wilson(result.mean, images * len(values))
    if math.isfinite(seeds[0]):
        low, high = min(low, seeds[0]), max(high, seeds[1])
    return max(0.0, low), min(1.0, high)


def seeds_to_resolve(a: Sequence[float], b: Sequence[float], margin: float) -> int | None:
    """Seeds a paired comparison needs to tell a difference of `margin` (alpha 0.05 two-sided, 80% power),
    from the spread of the measured differences; None when there is no spread to go by."""
    from scipy.stats import norm

    differences = [x - y for x, y in zip(a, b, strict=True)]
    deviation = std(differences)
    if not math.isfinite(deviation) or deviation <= 0 or margin <= 0:
        return None
    z = float(norm.ppf(1.0 - ALPHA / 2)) + float(norm.ppf(POWER))
    return max(MIN_SEEDS, math.ceil((z * deviation / margin) ** 2))
