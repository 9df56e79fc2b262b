"""Calibrate a cluster description's compute on one of its nodes: the step time of the shipped models per
precision, dense and with every eligible weight factored (AB's phase), on one accelerator, no collectives.

    python benchmarks/calibrate_cluster.py --out clusters/my-node.yaml --name my-node \\
        [--inter-gbit 25 --inter-latency-us 25 --intra-gbit 200 --nodes 16 --accelerators-per-node 4]
        [--models minivit,vit_b_16,resnet50] [--precisions fp32,bf16] [--batch 64] [--steps 10]

On a CUDA machine it times the GPU (fp32, bf16, fp16); on this one the CPU (fp32), with small batches so
it ends in minutes (6 on 2 busy cores), where AdamW's update of the whole model weighs on each sample. Each (model, precision): `--steps` timed steps (forward, backward, AdamW) after 3 warm-up
steps, dense, then with every eligible weight factored at a quarter of its full rank (abtune's own
factoring, abtune/methods/ab/lowrank.py: the factored layers compute with two thin products; A frozen,
as an AB phase trains one factor). It writes a whole cluster description: the measured compute, and
the links from the flags (a single node cannot measure its interconnect). The encode/decode compute of sbc
and powersgd is not timed here: a `compute.from_run` description (a run on the machine itself) contains it.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.methods.ab.lowrank import as_matrix, eligible_weights, factor, factors, svd
from abtune.models import build_model, forward_flops_per_sample, parameter_count

MODELS = {  # the paper's mini ViT on CIFAR-100, and the two ImageNet scaling targets
    "minivit": (ModelConfig(arch="vit"), DatasetInfo(100, 32, 3, "cifar100")),
    "vit_b_16": (ModelConfig(arch="vit_b_16"), DatasetInfo(1000, 224, 3, "imagenet")),
    "resnet50": (ModelConfig(arch="resnet50"), DatasetInfo(1000, 224, 3, "imagenet")),
    # the quickstart's small ViT on digits (studies/run_quickstart.yaml): not by default, for a quick check
    "quickstart": (ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=4, hidden_dim=96, mlp_dim=192),
                   DatasetInfo(10, 8, 3, "digits")),
}
DEFAULT_MODELS = "minivit,vit_b_16,resnet50"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
RANK_SHARE = 0.25  # factored at a quarter of each weight's full rank
WARMUP_STEPS = 3


def factored(model: torch.nn.Module) -> torch.nn.Module:
    """Every eligible weight factored at a quarter of its full rank, A frozen (an AB phase trains one factor)."""
    for ref in eligible_weights(model):
        weight = getattr(ref.module(model), ref.attr).detach()
        rank = max(1, int(RANK_SHARE * min(as_matrix(weight).shape)))
        factor(model, ref, rank, svd(weight))
        factors(model, ref)[0].requires_grad_(False)
    return model


def training_step(model: torch.nn.Module, info: DatasetInfo, precision: str, batch: int,
                  device: torch.device) -> Callable[[], None]:
    """One step of `model` (forward, backward, AdamW over its trainable parameters) on a fixed random batch."""
    model = model.to(device).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    images = torch.randn(batch, info.in_channels, info.image_size, info.image_size, device=device)
    labels = torch.randint(0, info.num_classes, (batch,), device=device)
    autocast = torch.autocast(device.type, dtype=DTYPES[precision]) if precision in DTYPES else torch.autocast(
        device.type, enabled=False)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step() -> None:
        with autocast:
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


def seconds_per_step(step: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def seconds_per_sample(model: torch.nn.Module, info: DatasetInfo, precision: str, batch: int, steps: int,
                       device: torch.device) -> float:
    step = training_step(model, info, precision, batch, device)
    for _ in range(WARMUP_STEPS):
        step()
    return seconds_per_step(step, steps, device) / batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--precisions", default=None, help="default: fp32,bf16,fp16 on CUDA, fp32 on the CPU")
    parser.add_argument("--batch", type=int, default=None, help="default: 64 on CUDA, 4 on the CPU")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 10 on CUDA, 2 on the CPU)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--accelerators-per-node", type=int, default=1)
    parser.add_argument("--inter-gbit", type=float, default=25.0)
    parser.add_argument("--inter-latency-us", type=float, default=25.0)
    parser.add_argument("--intra-gbit", type=float, default=200.0)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precisions = (args.precisions or ("fp32,bf16,fp16" if cuda else "fp32")).split(",")
    batch, steps = args.batch or (64 if cuda else 4), args.steps or (10 if cuda else 2)
    name = torch.cuda.get_device_name() if cuda else f"{platform.processor() or 'CPU'} ({torch.get_num_threads()} threads)"
    measured = []
    for model_name in args.models.split(","):
        cfg, info = MODELS[model_name]
        dense = build_model(cfg, info)
        low = factored(build_model(cfg, info))
        for precision in precisions:
            full_s = seconds_per_sample(dense, info, precision, batch, steps, device)
            low_s = seconds_per_sample(low, info, precision, batch, steps, device)
            entry = {"arch": cfg.arch, "forward_flops_per_sample": forward_flops_per_sample(cfg, info),
                     "precision": precision, "full_seconds_per_sample": full_s, "lowrank_seconds_per_sample": low_s,
                     "lowrank_params_ratio": parameter_count(low) / parameter_count(dense), "device": name}
            measured.append(entry)
            print(f"{model_name} {precision}: dense {full_s * 1e3:.3f} ms a sample, factored "
                  f"({entry['lowrank_params_ratio']:.2f} of the parameters) {low_s * 1e3:.3f} ms", flush=True)
    description = {
        "name": args.name, "description": f"calibrated on {name}", "nodes": args.nodes,
        "accelerators_per_node": args.accelerators_per_node,
        "inter_node": {"gbit_per_s": args.inter_gbit, "latency_us": args.inter_latency_us},
        "intra_node": {"gbit_per_s": args.intra_gbit, "latency_us": 1.0},
        "compute": {"measured": measured, "backward_overlap": 0.667,
                    "source": f"benchmarks/calibrate_cluster.py on {name}, batch {batch}, {steps} steps, "
                              f"{time.strftime('%Y-%m-%d')}"},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(description, sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
