"""The paper-tables benchmark's arithmetic (benchmarks/bench_ab_paper.py), without training."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from tests.bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_ab_paper")


def test_mean_and_sample_std(bench: ModuleType) -> None:
    assert bench.mean_std([0.95]) == "0.9500"
    assert bench.mean_std([0.94, 0.96]) == "0.9500 ± 0.0141"  # sample std: 0.01 * sqrt(2)


def test_constant_global_batch_keeps_four_ranks_global_batch(bench: ModuleType) -> None:
    runs = bench.table1_runs(argparse.Namespace(ranks=[4, 8]), 32)
    assert runs == [(4, "both (one run)", 32), (8, "constant local", 32), (8, "constant global", 16)]


def test_the_arms_interleave_and_every_run_has_its_own_folder(bench: ModuleType) -> None:
    runs = bench.plan(argparse.Namespace(ranks=[4, 8], seeds=[0, 1], cutoffs=[0.1, 0.3]), 32)
    assert [(r.table, r.method, r.ranks, r.local_batch) for r in runs[:6]] == [
        ("1", "ddp", 4, 32), ("1", "ab", 4, 32), ("1", "ddp", 8, 32), ("1", "ab", 8, 32),
        ("1", "ddp", 8, 16), ("1", "ab", 8, 16)]
    assert [(r.method, r.seed, r.cutoff) for r in runs[6:11]] == [
        ("ddp", 0, None), ("ab", 0, 0.1), ("ab-nogroups", 0, 0.1), ("ab", 0, 0.3), ("ab-nogroups", 0, 0.3)]
    assert len(runs) == 6 + 2 * 5 and len({r.folder for r in runs}) == len(runs)
    assert all(r.cutoff is None for r in runs if r.method == "ddp")


def test_a_ddp_run_carries_no_ab_only_keys_and_only_ab_runs_get_the_cutoff(bench: ModuleType) -> None:
    assert bench.method_sets({"name": "ab"}, "ddp", None) == ["method.name=ddp"]
    base = {"name": "ab", "warmup_frac": 0.2, "sigma_cutoff": 0.1}
    assert bench.method_sets(base, "ddp", None) == ["method={name: ddp}"]
    assert bench.method_sets(base, "ab-nogroups", 0.3) == ["method.name=ab-nogroups", "method.sigma_cutoff=0.3"]
    assert bench.method_sets({"name": "ddp", "comm_hook": "noop"}, "ab", 0.1) == ["method={name: ab}",
                                                                                  "method.sigma_cutoff=0.1"]
    with pytest.raises(ValueError, match="ddp takes no sigma_cutoff"):
        bench.method_sets({"name": "ab"}, "ddp", 0.1)


def test_table_1_is_bytes_per_step_and_their_ratio(bench: ModuleType) -> None:
    def result(method: str, per_step: float) -> object:
        return bench.Result("1", method, 8, "constant global", 16, 0, None, 0.9, 1.0, None, per_step * 300,
                            per_step, 0, 0)

    table = bench.table1([result("ddp", 0.4), result("ab", 0.1)])
    assert table.splitlines()[2] == "| 8 | constant global | 16 | 128 | 0.4000 | 0.1000 | 0.250 |"


def test_table_2_sets_each_seed_against_ddp_of_that_seed(bench: ModuleType) -> None:
    def result(method: str, seed: int, top1: float, inter_mb: float, cutoff: float | None = 0.1) -> object:
        compression, factored = (1.0, 0) if method == "ddp" else (2.5, 8)
        return bench.Result("2", method, 4, "constant local", 32, seed, cutoff, top1, compression,
                            None if method == "ddp" else 45.0, inter_mb, inter_mb / 300, factored, factored)

    results = [result("ddp", 0, 0.95, 140.0, None), result("ddp", 1, 0.96, 140.0, None),
               result("ab", 0, 0.96, 56.0), result("ab", 1, 0.95, 56.0),
               result("ab-nogroups", 0, 0.95, 70.0), result("ab-nogroups", 1, 0.96, 70.0)]
    lines = bench.table2(results).splitlines()
    assert lines[2] == "| ddp | - | 0.9550 ± 0.0071 | - | 1.00:1 | - | 140.0000 ± 0.0000 | 1.00:1 | - |"
    # ab: +1 point at seed 0, -1 at seed 1 against that seed's ddp, 2.5:1 less inter-node traffic
    assert lines[3] == ("| ab | 0.1 | 0.9550 ± 0.0071 | +0.00 ± 1.41 | 2.50:1 (2.50-2.50) | 45.00% "
                        "| 56.0000 ± 0.0000 | 2.50:1 | 8/8 |")
    assert lines[4].startswith("| ab-nogroups | 0.1 | 0.9550 ± 0.0071 | +0.00 ± 0.00 |")
