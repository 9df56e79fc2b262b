"""The cluster time model (abtune/timing.py) beside figures nobody here wrote: training images/s per A100 from
NVIDIA DeepLearningExamples and FlagPerf, and the all-reduce time of a model's gradients over HDR InfiniBand
from NCCL's published bus bandwidth. No GPU and no training: each row predicts one DDP step of a synthetic run
(its gradient all-reduces counted by abtune's meter as training would count them) on a shipped description.

    python benchmarks/bench_published_figures.py            # prints BENCHMARKS.md's tables (Markdown)

Rows whose prediction is the published figure by construction (the description holds that figure) say so;
the others check what the description does not hold: more GPUs, more nodes, another batch, another model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from abtune.comm import CommMeter, Op, Topology
from abtune.timing import Cluster, collective_seconds, load_cluster, predict

MIB = 2**20
PUBLISHED_BATCH = 256  # per GPU, in every published row
DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel's bucket_cap_mb default
GRADIENT_BYTES = {"resnet50": 25_557_032 * 4, "vit_b_16": 86_567_656 * 4}  # fp32 gradients (torchvision counts)
FLOPS = {"resnet50": 8_178_368_512, "vit_b_16": 35_127_656_448}  # abtune's forward count at 224 px
HDR_BUSBW_PER_ADAPTER = 24e9  # bytes/s: NCCL all-reduce bus bandwidth on one HDR adapter (nccl issues 412, 1576)
DLE_2020, DLE_2021, FLAGPERF = "dle-2020", "dle-2021", "flagperf"  # Markdown link labels
SOURCES = {
    DLE_2020: "https://github.com/NVIDIA/DeepLearningExamples/blob/9061083098da527671529366315f5bc0e16493c4/"
              "PyTorch/Classification/ConvNets/resnet50v1.5/README.md",
    DLE_2021: "https://github.com/NVIDIA/DeepLearningExamples/blob/5843f4e5a1220dd98936e477d8597d8a77320666/"
              "PyTorch/Classification/ConvNets/resnet50v1.5/README.md",
    FLAGPERF: "https://github.com/FlagOpen/FlagPerf/blob/c87aa312b9a4c64371d601fe712bb2e57acab98a/"
              "training/nvidia/vit-pytorch/README.md",
}


def ddp_run(arch: str, precision: str, batch: int, nodes: int, per_node: int) -> dict[str, Any]:
    """A summary.json of one DDP step: the model's gradients all-reduced in DDP's 25 MiB buckets."""
    topology = Topology(tuple(rank // per_node for rank in range(nodes * per_node)))
    gradient = GRADIENT_BYTES[arch]
    buckets = math.ceil(gradient / DDP_BUCKET_BYTES)
    meters = [CommMeter(topology, rank=rank) for rank in range(topology.world_size)]
    for meter in meters:
        meter.phase = "train"
        for _ in range(buckets):
            meter.record(Op.ALL_REDUCE, gradient // buckets, meter.world())
    return {"world_size": topology.world_size, "num_nodes": nodes, "ranks_per_node": per_node, "steps_done": 1,
            "history": [], "traffic": {"rows_per_rank": [m.rows() for m in meters]},
            "config": {"model.arch": arch, "train.precision": precision},
            "compression": {"dense_params": 1, "trained_model_params": 1},
            "timing": {"by_phase": {"train": {"steps": 1, "seconds": 0.0}}, "phase_starts": [("train", 0)],
                       "forward_flops_per_sample": FLOPS[arch], "local_batch_size": batch}}


@dataclass(frozen=True)
class RateRow:
    what: str
    arch: str
    precision: str
    nodes: int
    per_node: int
    published: float
    source: str
    note: str = ""  # empty: a figure the description does not hold and should predict within 20%

    @property
    def checks(self) -> bool:
        return not self.note


def rate_rows() -> list[RateRow]:
    return [
        RateRow("ResNet-50 AMP, 1 GPU", "resnet50", "bf16", 1, 1, 1240.81, DLE_2020, "held by the description"),
        RateRow("ResNet-50 AMP, 8 GPUs (one DGX A100)", "resnet50", "bf16", 1, 8, 9604.92 / 8, DLE_2020),
        RateRow("ResNet-50 TF32, 1 GPU", "resnet50", "fp32", 1, 1, 680.15, DLE_2020, "held by the description"),
        RateRow("ResNet-50 TF32, 8 GPUs (one DGX A100)", "resnet50", "fp32", 1, 8, 5379.82 / 8, DLE_2020),
        RateRow("ResNet-50 AMP, 1 GPU, A100-80GB, channels-last (2021 README)", "resnet50", "bf16", 1, 1, 2470,
                DLE_2021, "another GPU and memory layout"),
        RateRow("ResNet-50 TF32, 1 GPU, A100-80GB (2021 README)", "resnet50", "fp32", 1, 1, 938, DLE_2021,
                "another GPU and software"),
        RateRow("ViT-B/16 AMP, 8 GPUs (one node)", "vit_b_16", "bf16", 1, 8, 5441 / 8, FLAGPERF,
                "held by the description, plus the NVLink all-reduce"),
        RateRow("ViT-B/16 AMP, 2 nodes x 8 GPUs, one HDR adapter", "vit_b_16", "bf16", 2, 8, 10535 / 16, FLAGPERF),
        RateRow("ViT-B/16 AMP, 1 GPU", "vit_b_16", "bf16", 1, 1, 1151, FLAGPERF, "FlagPerf's rows disagree"),
    ]


def predicted_rate(row: RateRow, paper: Cluster) -> tuple[float, str]:
    """(images/s per GPU, compute source kind) of the row's layout at batch 256."""
    cluster = paper if row.nodes * row.per_node <= paper.accelerators_per_node else dgx_a100(paper)
    prediction = predict(ddp_run(row.arch, row.precision, PUBLISHED_BATCH, row.nodes, row.per_node), cluster)
    return PUBLISHED_BATCH / prediction.step_seconds["train"], prediction.compute_source.kind


def dgx_a100(paper: Cluster) -> Cluster:
    """The paper's description with a DGX A100's 8 GPUs a node and, as FlagPerf's README states, one
    200 Gbit/s InfiniBand link between nodes (NCCL's 24 GB/s of it)."""
    link = paper.inter_node.model_copy(update={"gbit_per_s": 200.0})
    return paper.model_copy(update={"name": "dgx-a100", "accelerators_per_node": 8, "inter_node": link})


def rate_table() -> list[str]:
    paper = load_cluster("paper-a100-hdr200")
    lines = ["| figure | published images/s per GPU | predicted | predicted / published | compute | note |",
             "|---|---|---|---|---|---|"]
    for row in rate_rows():
        predicted, kind = predicted_rate(row, paper)
        lines.append(f"| {row.what} | [{row.published:,.1f}][{row.source}] | {predicted:,.1f} | "
                     f"{predicted / row.published:.3f} | {kind} | {row.note} |")
    scaled = FLOPS["resnet50"] / FLOPS["vit_b_16"] * 1240.81
    lines.append(f"| ViT-B/16 AMP scaled from ResNet-50 AMP by FLOPs, against the 8-GPU row | [{5441 / 8:,.1f}][{FLAGPERF}] | "
                 f"{scaled:,.1f} | {scaled / (5441 / 8):.3f} | scaled | why scaling stays within a family |")
    for arch, published, source in (("resnet50", 1240.81, DLE_2020), ("vit_b_16", 5441 / 8, FLAGPERF)):
        before = 312e12 * 0.4 / (3 * FLOPS[arch])
        lines.append(f"| {arch} AMP, 1 GPU, the description before (40% of 312 TFLOP/s) | [{published:,.1f}][{source}] | "
                     f"{before:,.1f} | {before / published:.3f} | assumed | replaced |")
    return lines + [""] + [f"[{label}]: {url}" for label, url in SOURCES.items()]


def all_reduce_seconds(arch: str, nodes: int, cluster: Cluster) -> tuple[float, float]:
    """(predicted, from NCCL's published bus bandwidth) seconds of one all-reduce of the model's fp32
    gradients over `nodes` of the paper's nodes (4 GPUs, 2 HDR adapters each): the published time is
    bytes x 2(n-1)/n / busbw, n the ranks, busbw 24 GB/s an adapter."""
    gradient, ranks = GRADIENT_BYTES[arch], nodes * 4
    topology = Topology(tuple(rank // 4 for rank in range(ranks)))
    meters = [CommMeter(topology, rank=rank) for rank in range(ranks)]
    for meter in meters:
        meter.phase = "train"
        meter.record(Op.ALL_REDUCE, gradient, meter.world())
    rows = {rank: meter.rows()[0] for rank, meter in enumerate(meters)}
    predicted = collective_seconds(rows, ranks, topology.node_of_rank, cluster)
    return predicted, gradient * 2 * (ranks - 1) / ranks / (2 * HDR_BUSBW_PER_ADAPTER)


def all_reduce_table() -> list[str]:
    paper = load_cluster("paper-a100-hdr200")
    lines = ["| gradients | nodes x GPUs | MB | predicted ms | from published busbw (48 GB/s a node) ms | "
             "predicted / published |", "|---|---|---|---|---|---|"]
    for arch, gradient in GRADIENT_BYTES.items():
        for nodes in (2, 4, 8):
            predicted, reference = all_reduce_seconds(arch, nodes, paper)
            lines.append(f"| {arch} | {nodes} x 4 | {gradient / 1e6:.1f} | {predicted * 1e3:.2f} | "
                         f"{reference * 1e3:.2f} | {predicted / reference:.3f} |")
    return lines


def main() -> None:
    print("\n".join(rate_table()))
    print()
    print("\n".join(all_reduce_table()))


if __name__ == "__main__":
    main()
