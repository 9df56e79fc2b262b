"""Whether early accuracy ranks a study's trials as their end does: the test of whether pruning can pay.

A pruner (median, hyperband, pareto-asha) judges a trial by its top-1 at an evaluation. That is only
as good as the rank correlation, across trials, between top-1 there and final top-1: where it is
low (a small validation set, AB's phases moving accuracy up and down) a pruner stops trials that
would have ended on the front. `study best` prints it per evaluation step from the trials' stored
evaluations, so a study run without a pruner tells whether one would have paid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from optuna.trial import FrozenTrial

from abtune.attrs import EVALUATIONS_ATTR

MIN_TRIALS = 5  # fewer completed trials say nothing about a rank correlation


def early_vs_final(trials: Sequence[FrozenTrial]) -> dict[int, tuple[float, int]]:
    """{step: (Spearman correlation of top-1 at `step` with final top-1, trials)} over completed trials that
    evaluated at `step` before their last step; steps with fewer than MIN_TRIALS trials are left out."""
    finals: dict[int, float] = {}
    at_step: dict[int, dict[int, float]] = {}
    for index, trial in enumerate(trials):
        evaluations = {int(s): v.get("top1") for s, v in trial.user_attrs.get(EVALUATIONS_ATTR, {}).items()}
        if not evaluations or "top1" not in trial.user_attrs:
            continue
        finals[index] = float(trial.user_attrs["top1"])
        last = max(evaluations)
        for step, value in evaluations.items():
            if step < last and value is not None:
                at_step.setdefault(step, {})[index] = float(value)
    result = {}
    for step, values in sorted(at_step.items()):
        if len(values) >= MIN_TRIALS:
            numbers = sorted(values)
            result[step] = (spearman([values[n] for n in numbers], [finals[n] for n in numbers]), len(numbers))
    return result


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation of the ranks (ties share their mean rank); nan when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def describe(correlations: dict[int, tuple[float, int]]) -> str | None:
    if not correlations:
        return None
    shown = ", ".join(f"step {s} " + ("all equal" if math.isnan(rho) else f"{rho:.2f}")
                      for s, (rho, _) in correlations.items())
    trials = max(n for _, n in correlations.values())
    return (f"top-1 at an evaluation vs final top-1 (Spearman over {trials} completed trials): {shown}; a pruner "
            "judging where this is well below 1 stops trials that would have ended on the front")
