"""Time of one AB decomposition (one SVD per eligible weight: rank selection and factors).

    python benchmarks/bench_svd.py [--repeats 3]

Uses the paper's mini ViT (patch 8, depth 6, 6 heads, hidden 768, MLP 3072, CIFAR-100 shapes),
one process, on whatever this machine has.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.methods.ab import lowrank
from abtune.models import build_model

CIFAR100 = DatasetInfo(num_classes=100, image_size=32, in_channels=3)


def decompose_once(model: torch.nn.Module, refs: list[lowrank.WeightRef], cutoff: float) -> float:
    started = time.perf_counter()
    for ref in refs:
        weight = getattr(ref.module(model), ref.attr)
        decomposition = lowrank.svd(weight)
        rank = lowrank.rank_for_cutoff(decomposition[1], cutoff)
        lowrank.factorize(weight, rank, decomposition)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cutoff", type=float, default=0.1)
    args = parser.parse_args()
    model = build_model(ModelConfig(), CIFAR100)
    refs = lowrank.eligible_weights(model)
    dense = sum(p.numel() for p in model.parameters())
    times = [decompose_once(model, refs, args.cutoff) for _ in range(args.repeats)]
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"mini ViT: {dense:,} parameters, {len(refs)} factored weights")
    print(f"one decomposition: median {statistics.median(times):.3f} s over {args.repeats} (min {min(times):.3f}, max {max(times):.3f})")


if __name__ == "__main__":
    main()
