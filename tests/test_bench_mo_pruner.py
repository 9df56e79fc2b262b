"""The pruner benchmark's arithmetic (benchmarks/bench_mo_pruner.py) on a constructed table, without training."""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest

from tests.bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_mo_pruner")


def test_hypervolume_of_a_two_objective_front(bench: ModuleType) -> None:
    reference = (0.5, 100.0)  # top-1 floor, bytes ceiling
    assert bench.hypervolume([], reference) == 0.0
    assert bench.hypervolume([(0.9, 40.0)], reference) == pytest.approx(0.4 * 60)
    # a second point adds the strip it alone dominates; a dominated point and one past the reference add nothing
    two = bench.hypervolume([(0.9, 40.0), (0.7, 10.0)], reference)
    assert two == pytest.approx(0.4 * 60 + 0.2 * 30)
    assert bench.hypervolume([(0.9, 40.0), (0.7, 10.0), (0.6, 50.0), (0.95, 120.0), (0.4, 5.0)], reference) == \
        pytest.approx(two)


def _table(bench: ModuleType) -> dict:
    """Top-1 set by warmup and sigma (known from the first evaluation on), bytes by warmup; 10 s a trial."""
    configs = {}
    for values in itertools.product(*bench.GRID.values()):
        params = dict(zip(bench.GRID, values, strict=True))
        top1 = 0.5 + params["method.warmup_frac"] + params["method.sigma_cutoff"] / 10
        megabytes = 20 + 100 * params["method.warmup_frac"] + 10 * params["method.ab_frac"]
        evaluations = [{"step": s, "top1": top1 * s / 300, "bytes": megabytes * 1e6, "elapsed": 2 + 8 * s / 300}
                       for s in range(25, 301, 25)]
        configs[bench.key(params)] = {"top1": top1, "bytes": megabytes * 1e6, "wall_seconds": 10.0,
                                      "evaluations": evaluations}
    return {"configs": configs, "ddp": {"bytes": 200e6}}


def test_replay_charges_pruned_trials_what_they_ran(bench: ModuleType) -> None:
    table = _table(bench)
    row = next(iter(table["configs"].values()))
    assert bench.stop_cost(row, row["evaluations"][1]) == pytest.approx(10.0 - (10.0 - (2 + 8 * 50 / 300)))
    reference = (0.5, 200e6)
    full = bench.replay(table, "random", False, 0, 100.0, 300, reference)
    assert (full.trials, full.pruned, full.costs[-1]) == (10, 0, 100.0)  # ten full trials fill the budget
    pruned = bench.replay(table, "random", True, 0, 100.0, 300, reference)
    assert pruned.pruned > 0 and pruned.trials > full.trials
    stops = [b - a for a, b in zip([0.0, *pruned.costs], pruned.costs, strict=False)]
    assert all(s == pytest.approx(10.0) or s == pytest.approx(2 + 8 * 50 / 300) or s == pytest.approx(2 + 8 * 100 / 300)
               for s in stops), stops  # whole trials, or stopped at the first evaluation past rung 34 or 100
    assert pruned.hypervolumes == sorted(pruned.hypervolumes)  # completed trials only add to the front
    # the same seed and table replay the same study
    again = bench.replay(table, "random", True, 0, 100.0, 300, reference)
    assert (again.costs, again.hypervolumes) == (pruned.costs, pruned.hypervolumes)
