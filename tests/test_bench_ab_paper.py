"""The paper-tables benchmark's arithmetic (benchmarks/bench_ab_paper.py), without training."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench_ab_paper.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ab_paper", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_mean_and_sample_std(bench: ModuleType) -> None:
    assert bench.mean_std([0.95]) == "0.9500"
    assert bench.mean_std([0.94, 0.96]) == "0.9500 ± 0.0141"  # sample std: 0.01 * sqrt(2)


def test_constant_global_batch_keeps_four_ranks_global_batch(bench: ModuleType) -> None:
    runs = bench.table1_runs(argparse.Namespace(ranks=[4, 8]), 32)
    assert runs == [(4, "constant local", 32), (8, "constant local", 32), (8, "constant global", 16)]


def test_table_1_is_bytes_per_step_and_their_ratio(bench: ModuleType) -> None:
    def result(method: str, per_step: float) -> object:
        return bench.Result("1", method, 8, "constant global", 16, 0, None, 0.9, 1.0, None, per_step * 300,
                            per_step, 0, 0)

    table = bench.table1([result("ddp", 0.4), result("ab", 0.1)])
    assert table.splitlines()[2] == "| 8 | constant global | 16 | 128 | 0.4000 | 0.1000 | 0.250 |"
