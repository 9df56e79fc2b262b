"""Calibrate a cluster description's compute on one of its nodes: the step time of the shipped models per
precision, dense and with every eligible weight factored (AB's phase), on one accelerator, no collectives.

    python benchmarks/calibrate_cluster.py --out clusters/my-node.yaml --name my-node \\
        [--inter-gbit 25 --inter-efficiency 0.9 --inter-latency-us 25 --intra-gbit 200 --nodes 16 \\
         --accelerators-per-node 4] [--models minivit,vit_b_16,resnet50] [--precisions fp32,bf16] \\
        [--batches 1,16,64] [--steps 10]

On a CUDA machine it times the GPU (fp32, bf16, fp16); on this one the CPU (fp32), with small batches so
it ends in minutes, where AdamW's update of the whole model weighs on each step. Each (model, precision,
batch): `--steps` timed steps (forward, backward, AdamW) after 3 warm-up steps, dense, then with every
eligible weight factored at a quarter of its full rank (abtune's own factoring,
abtune/methods/ab/lowrank.py: the factored layers compute with two thin products; A frozen, as an AB
phase trains one factor). A line through step time against batch size (least squares over
`--batches`) gives the seconds a sample (its slope) and the fixed cost of a step (its intercept: kernel
launches, the optimizer), which the time model adds to every step. It writes a whole cluster description:
the measured compute, the smallest intercept as the description's step floor (for models it did not calibrate), and the links from the flags (a single node
cannot measure its interconnect: nccl-tests' all_reduce_perf busbw over the link's rate is its efficiency).
The encode/decode compute of sbc and powersgd is not timed here: a `compute.from_run` description (a run on
the machine itself) contains it.
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


def fit_line(batches: list[int], seconds: list[float]) -> tuple[float, float]:
    """(intercept, slope) of step seconds against batch size by least squares. When noise makes the intercept
    negative or the slope not positive, the batches cannot tell the two apart: no floor, and the slope of
    the line through the origin."""
    n = len(batches)
    mean_b, mean_s = sum(batches) / n, sum(seconds) / n
    spread = sum((b - mean_b) ** 2 for b in batches)
    slope = sum((b - mean_b) * (s - mean_s) for b, s in zip(batches, seconds, strict=True)) / spread
    intercept = mean_s - slope * mean_b
    if intercept < 0 or slope <= 0:
        return 0.0, sum(b * s for b, s in zip(batches, seconds, strict=True)) / sum(b * b for b in batches)
    return intercept, slope


def step_seconds(model: torch.nn.Module, info: DatasetInfo, precision: str, batch: int, steps: int,
                 device: torch.device) -> float:
    step = training_step(model, info, precision, batch, device)
    for _ in range(WARMUP_STEPS):
        step()
    return seconds_per_step(step, steps, device)


def calibrate(model: torch.nn.Module, info: DatasetInfo, precision: str, batches: list[int], steps: int,
              device: torch.device) -> tuple[float, float]:
    """(step floor, seconds a sample) of `model`."""
    return fit_line(batches, [step_seconds(model, info, precision, b, steps, device) for b in batches])


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or 'CPU'} ({torch.get_num_threads()} threads)"


def measure(model_names: list[str], precisions: list[str], batches: list[int], steps: int,
            device: torch.device) -> list[dict[str, object]]:
    """A `compute.measured` entry per (model, precision): dense and factored step lines."""
    name = device_name(device)
    measured = []
    for model_name in model_names:
        cfg, info = MODELS[model_name]
        dense = build_model(cfg, info)
        low = factored(build_model(cfg, info))
        for precision in precisions:
            full_floor, full_s = calibrate(dense, info, precision, batches, steps, device)
            low_floor, low_s = calibrate(low, info, precision, batches, steps, device)
            entry = {"arch": cfg.arch, "forward_flops_per_sample": forward_flops_per_sample(cfg, info),
                     "precision": precision, "full_seconds_per_sample": full_s, "lowrank_seconds_per_sample": low_s,
                     "lowrank_params_ratio": parameter_count(low) / parameter_count(dense),
                     "step_floor_seconds": full_floor, "lowrank_step_floor_seconds": low_floor, "device": name}
            measured.append(entry)
            print(f"{model_name} {precision}: dense {full_floor * 1e3:.3f} ms + {full_s * 1e3:.3f} ms a sample, "
                  f"factored ({entry['lowrank_params_ratio']:.2f} of the parameters) {low_floor * 1e3:.3f} ms + "
                  f"{low_s * 1e3:.3f} ms a sample", flush=True)
    return measured


def describe(cluster_name: str, device: str, measured: list[dict[str, object]], batches: list[int], steps: int,
             links: dict[str, object]) -> dict[str, object]:
    """A whole cluster description (abtune/timing.py's Cluster): the measured compute and the links given."""
    how = f"benchmarks/calibrate_cluster.py on {device}, batches {batches}, {steps} steps, {time.strftime('%Y-%m-%d')}"
    floor_ms = min(float(m["step_floor_seconds"]) for m in measured) * 1e3  # type: ignore[arg-type]
    return {"name": cluster_name, "description": f"calibrated on {device}", **links,
            "compute": {"measured": measured, "step_floor_ms": floor_ms,
                        "step_floor_source": f"measured: the smallest dense intercept of step time against batch, {how}",
                        "backward_overlap": 0.667, "source": how}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--precisions", default=None, help="default: fp32,bf16,fp16 on CUDA, fp32 on the CPU")
    parser.add_argument("--batches", default=None, help="at least two batch sizes (default: 1,16,64 on CUDA, "
                                                        "1,2,4 on the CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 10 on CUDA, 2 on the CPU)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--accelerators-per-node", type=int, default=1)
    parser.add_argument("--inter-gbit", type=float, default=25.0)
    parser.add_argument("--inter-efficiency", type=float, default=1.0)
    parser.add_argument("--inter-latency-us", type=float, default=25.0)
    parser.add_argument("--intra-gbit", type=float, default=200.0)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precisions = (args.precisions or ("fp32,bf16,fp16" if cuda else "fp32")).split(",")
    batches = [int(b) for b in (args.batches or ("1,16,64" if cuda else "1,2,4")).split(",")]
    if len(set(batches)) < 2:
        parser.error(f"--batches {args.batches}: give at least two different batch sizes")
    steps = args.steps or (10 if cuda else 2)
    name = device_name(device)
    measured = measure(args.models.split(","), precisions, batches, steps, device)
    links = {"nodes": args.nodes, "accelerators_per_node": args.accelerators_per_node,
             "inter_node": {"gbit_per_s": args.inter_gbit, "efficiency": args.inter_efficiency,
                            "latency_us": args.inter_latency_us},
             "intra_node": {"gbit_per_s": args.intra_gbit, "latency_us": 1.0}}
    description = describe(args.name, name, measured, batches, steps, links)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(description, sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
