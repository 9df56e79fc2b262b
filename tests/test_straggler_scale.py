"""Scale is not flat: a synchronous step waits for the slowest of its ranks (abtune/timing.py `straggling`,
`expected_slowest`, the clusters' `straggler_cv` fitted to NVIDIA's 1-to-8-GPU ResNet-50 series)."""

from __future__ import annotations

import pytest

from abtune.timing import PlannedRun, estimate_run, expected_slowest, load_cluster, straggling

RESNET50 = ("resnet50", 8178368512, 25_557_032)
VIT_B_16 = ("vit_b_16", 35127656448, 86_567_656)


def per_gpu_rate(model: tuple[str, int, int], nodes: int, per_node: int, batch: int = 256) -> float:
    run = PlannedRun(model[0], model[1], model[2], "bf16", batch, 100, nodes, per_node)
    return batch / estimate_run(run, load_cluster("paper-a100-hdr200")).step_seconds


def test_the_expected_slowest_of_n_grows_with_n() -> None:
    assert expected_slowest(1) == 0.0
    assert expected_slowest(8) == pytest.approx(1.4236, abs=0.015)  # the exact expectation: 1.4236
    assert expected_slowest(2) < expected_slowest(8) < expected_slowest(128) < expected_slowest(1024)


def test_predicted_steps_slow_down_from_2_to_32_nodes() -> None:
    rates = [per_gpu_rate(VIT_B_16, nodes, 4) for nodes in (2, 4, 8, 16, 32)]
    assert all(later < earlier for earlier, later in zip(rates, rates[1:], strict=False))


def test_published_multi_gpu_series_within_20_percent() -> None:
    """The per-GPU rates of NVIDIA's and FlagPerf's published series (BENCHMARKS.md, "Scale"), from their
    smallest run: ResNet-50 AMP 1 to 8 A100s, ViT-B/16 AMP 8 A100s (one node) to 16 (two nodes)."""
    paper = load_cluster("paper-a100-hdr200").compute
    resnet_8 = 1240.81 / straggling(paper, 8)  # the 1-GPU rate, waiting for the slowest of 8
    assert resnet_8 == pytest.approx(9604.92 / 8, rel=0.2)
    assert resnet_8 == pytest.approx(9604.92 / 8, rel=0.01)  # the fit itself
    vit_16 = 680.125 * straggling(paper, 8) / straggling(paper, 16)
    assert vit_16 == pytest.approx(10535 / 16, rel=0.2)
    assert per_gpu_rate(VIT_B_16, 2, 8 // 2) < per_gpu_rate(VIT_B_16, 1, 2)
