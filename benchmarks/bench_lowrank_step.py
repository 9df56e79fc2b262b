"""Step time of AB's factored phase against a dense step, one process, no collectives.

    python benchmarks/bench_lowrank_step.py [--models quickstart,minivit,vit_b_16] [--repeats 5] [--steps 3]
        [--ranks-from RUN_DIR/summary.json] [--threads 1] [--batch N] [--precision bf16|fp32]

A step is forward, backward, AdamW and zero_grad, as a rank trains it (the step of
benchmarks/calibrate_cluster.py). Arms, timed interleaved (every repeat times each arm in turn, so load that comes and goes hits
all of them):

- dense: the model as warmup and rebound train it, every parameter trained;
- ab (thin): every eligible weight factored (abtune/methods/ab/layers.py), A frozen and B trained as
  `ab-nogroups` (and half of `ab`'s groups) train them; thin products wherever r(m+n) < mn;
- ab (A·B): the same factors computed as before the factored layers: A·B formed each step, dense product.

Ranks: the quickstart at the ranks its own run chose at its first decomposition (the `--ranks-from`
summary's, or those of `abtune train studies/run_quickstart.yaml --nproc 4 --ranks-per-node 2`: ranks
11-36 of 96), the mini ViT (CIFAR-100 shape) and ViT-B/16 (224 px) at a quarter of each weight's full rank.
On a CUDA machine it runs the GPU in bf16 autocast (`--precision fp32` for full precision), else the CPU in
fp32. `--batch` replaces every model's local batch (the defaults are sized for a CPU; a GPU step at batch 4 is
bound by kernel launches, not by the arithmetic AB removes). Prints each arm's training-mode
forward FLOPs against dense (torch's flop counter, independent of load), the median step time of each arm, the spread of the repeats (min-max), each arm's median ratio to dense over the repeats, and
`uptime` before and after: a loaded machine's numbers are not results.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
from pathlib import Path

import torch
from calibrate_cluster import seconds_per_step, training_step
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from abtune.config import ModelConfig, load_run_config
from abtune.data import DatasetInfo
from abtune.methods.ab import lowrank
from abtune.models import build_model

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = load_run_config(REPO / "studies" / "run_quickstart.yaml")
QUICKSTART_RANKS = {  # the quickstart run's first decomposition (step 60), under encoder.layers.
    "encoder_layer_0.self_attention.in_proj_weight": 17, "encoder_layer_0.self_attention.out_proj.weight": 15,
    "encoder_layer_0.mlp.0.weight": 36, "encoder_layer_0.mlp.3.weight": 34,
    "encoder_layer_1.self_attention.in_proj_weight": 22, "encoder_layer_1.self_attention.out_proj.weight": 11,
    "encoder_layer_1.mlp.0.weight": 16, "encoder_layer_1.mlp.3.weight": 17,
}
MODELS: dict[str, tuple[ModelConfig, DatasetInfo, int]] = {  # model, data shape, local batch
    "quickstart": (QUICKSTART.model, DatasetInfo(10, 8, 3, "digits"), QUICKSTART.train.local_batch_size),
    "minivit": (ModelConfig(arch="vit"), DatasetInfo(100, 32, 3, "cifar100"), 32),
    "vit_b_16": (ModelConfig(arch="vit_b_16"), DatasetInfo(1000, 224, 3, "imagenet"), 4),
}
QUARTER = 0.25
WARMUP_STEPS = 2  # per arm, before the first repeat


def quickstart_ranks(summary: Path | None) -> dict[str, int]:
    if summary is not None:
        return dict(json.loads(summary.read_text())["decompositions"][0]["ranks"])
    return {f"encoder.layers.{key}": rank for key, rank in QUICKSTART_RANKS.items()}


def quarter_ranks(model: nn.Module, refs: list[lowrank.WeightRef]) -> dict[str, int]:
    return {ref.key: max(1, int(QUARTER * min(lowrank.as_matrix(getattr(ref.module(model), ref.attr)).shape)))
            for ref in refs}


def factored(model: nn.Module, ranks: dict[str, int], thin: bool | None) -> nn.Module:
    """A copy with every weight in `ranks` factored (fake factors: the values do not change the time), A frozen."""
    model = copy.deepcopy(model)
    for ref in lowrank.eligible_weights(model):
        if ref.key not in ranks:
            continue
        m, n = lowrank.as_matrix(getattr(ref.module(model), ref.attr)).shape
        full = min(m, n)
        decomposition = (torch.eye(m, full), torch.linspace(1, 0.1, full), torch.eye(full, n))
        lowrank.factor(model, ref, ranks[ref.key], tuple(t.to(next(model.parameters()).device) for t in decomposition),
                       thin=thin)
        lowrank.factors(model, ref)[0].requires_grad_(False)
    return model


def forward_flops(model: nn.Module, info: DatasetInfo, batch: int) -> int:
    """Training-mode forward FLOPs of a batch (torch's flop counter, on the meta device: shapes only)."""
    counter = FlopCounterMode(display=False)
    with counter:
        copy.deepcopy(model).to("meta").train()(
            torch.zeros(batch, info.in_channels, info.image_size, info.image_size, device="meta"))
    return int(counter.get_total_flops())


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> list[str]:
    cfg, info, batch = MODELS[name]
    batch = args.batch or batch
    dense = build_model(cfg, info).to(device)
    refs = lowrank.eligible_weights(dense)
    ranks = quickstart_ranks(args.ranks_from) if name == "quickstart" else quarter_ranks(dense, refs)
    arms = {"dense": dense, "ab (thin)": factored(dense, ranks, None), "ab (A·B)": factored(dense, ranks, False)}
    flops = {arm: forward_flops(model, info, batch) for arm, model in arms.items()}
    precision = args.precision if device.type == "cuda" else "fp32"
    steps = {arm: training_step(model, info, precision, batch, device) for arm, model in arms.items()}
    for step in steps.values():
        for _ in range(WARMUP_STEPS):
            step()
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm, step in steps.items():
            times[arm].append(seconds_per_step(step, args.steps, device))
    span = f"ranks {min(ranks.values())}-{max(ranks.values())}"
    rows = []
    for arm, seconds in times.items():
        ratios = [s / d for s, d in zip(seconds, times["dense"], strict=True)]
        rows.append(f"| {name} ({span}) | {batch} | {arm} | {flops[arm] / flops['dense']:.3f} | "
                    f"{statistics.median(seconds) * 1e3:.1f} | {min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f} | "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return rows


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps timed together in each repeat")
    parser.add_argument("--ranks-from", type=Path, default=None, help="a quickstart run's summary.json")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as abtune's local ranks)")
    parser.add_argument("--batch", type=int, default=None, help="local batch of every model (default: each model's own)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="on a GPU (a CPU runs fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = (f"{torch.cuda.get_device_name()}, {args.precision}" if device.type == "cuda"
             else f"CPU, {torch.get_num_threads()} threads, fp32")
    print(f"{where}; {args.repeats} repeats x {args.steps} steps, arms interleaved")
    print("uptime before:", uptime(), flush=True)
    print("| model | batch | arm | forward FLOPs vs dense | ms/step (median) | spread (min-max) | "
          "step vs dense (median, min-max) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for row in bench_model(name, args, device):
            print(row, flush=True)
    print("uptime after: ", uptime())


if __name__ == "__main__":
    main()
