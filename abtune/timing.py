"""Time on a user's cluster: a step-time model from a run's exact byte and message counts.

A finished run knows, per phase, how many steps it trained and how long they took here, and per rank
every collective's bytes and gloo messages to other nodes (`abtune.comm`, `abtune.wire`). A cluster
description (clusters/NAME.yaml) says what the user's nodes have. The model puts the two together; each
line of it can be checked by hand:

    link seconds of a collective = max over nodes of (the node's ranks' inter-node bytes + gloo framing
                                   + packet headers) x 8 / inter-node rate
                                 + calls x rounds of its algorithm x latency        (alpha-beta)
    compute seconds of a step    = the run's own step times (`compute.from_run`), or
                                   the step floor + local batch x seconds a sample, the latter from (first
                                   that fits the run's model, image size and precision):
                                   a calibration on the cluster's accelerator, between its dense and
                                   factored measurements by the phase's parameters        (measured),
                                   a public measurement's images/s, net of the floor       (published),
                                   the nearest of those for the same architecture family,
                                   times the ratio of forward FLOPs                       (scaled), or
                                   3 x forward FLOPs / (TFLOP/s x efficiency)             (assumed);
                                   an AB phase's seconds a sample scale with its factored layers' FLOPs
                                   at the ranks the run chose (`phase_flops_ratio`)
    step seconds of a phase      = when DDP's last gradient bucket is all-reduced (see overlap)
                                   + blocking collectives
    train seconds                = sum over phases of steps x step seconds, + AB's syncs

Overlap: DDP all-reduces a bucket of gradients as soon as the backward pass has filled it, while the
backward goes on. With k buckets a step (the gradient all-reduce row's calls per step), each taking c of
link time, bucket j is ready at (1 - b + b j / k) x compute (b = `compute.backward_overlap`, the backward's
share of a step's compute) and the link takes them in order: end_j = max(ready_j, end_j-1) + c, and the
step ends at max(compute, end_k). One bucket (every small model) overlaps nothing: compute + c. These are
the gradient all-reduces of the training phases (ddp, fp16, powersgd, AB's full-rank and group phases);
every other collective (AB's syncs, SBC's all-gathers) blocks. Intra-node collectives cost their bytes at
the intra-node rate. The run's placement is kept: its nodes and ranks per node must fit the cluster's.
Evaluation, checkpoint and set-up traffic are not training time (as train_seconds) and are left out.

Every prediction carries where its compute came from (`ComputeSource`: measured, published, scaled or
assumed) and notes a user should read: compute that is a guess (scaled or assumed), and steps that are
mostly the description's per-step floor. Callers print these; nothing above this module re-derives them.

Torch-free: `abtune compare --cluster` and the study objective read it beside summaries.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from abtune import wire
from abtune.errors import ConfigError
from abtune.named_yaml import NamedFiles
from abtune.phases import TRAINING_PHASES, Phase
from abtune.yamlfile import read_yaml

CLUSTERS = NamedFiles("clusters")
BACKWARD_FLOPS_PER_FORWARD = 2.0  # a step: one forward, a backward of about twice its FLOPs
GIGA = 1e9
FLOOR_KINDS = ("measured", "published", "assumed")
MIN_REAL_STEP_S = 1e-3  # below this a predicted step without a floor is flagged
Precision = Literal["fp32", "bf16", "fp16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Link(_Strict):
    gbit_per_s: float = Field(gt=0.0, description="rate each way, per node (inter) or per rank (intra)")
    latency_us: float = Field(0.0, ge=0.0, description="one way")
    efficiency: float = Field(1.0, gt=0.0, le=1.0, description="the share of the rate a transfer sustains")
    header_bytes_per_packet: int = Field(66, ge=0, description="Ethernet + IPv4 + TCP with timestamps: 66")
    packet_payload_bytes: int = Field(1448, ge=1, description="TCP's MSS on a 1500-byte MTU: 1448")


class Throughput(_Strict):
    """The fallback when no measured or published rate fits: an assumed share of the accelerator's peak."""
    tflops: float | dict[Precision, float] = Field(
        description="the peak for the run's precision: one figure for all, or one per precision")
    efficiency: float = Field(gt=0.0, le=1.0, description="the share of the peak a training step reaches")

    @model_validator(mode="after")
    def _positive(self) -> Throughput:
        peaks = self.tflops.values() if isinstance(self.tflops, dict) else [self.tflops]
        if any(peak <= 0 for peak in peaks):
            raise ValueError(f"throughput.tflops must be positive, got {self.tflops}")
        return self

    def peak(self, precision: str) -> float | None:
        if isinstance(self.tflops, dict):
            return dict(self.tflops).get(precision)
        return self.tflops


class MeasuredStep(_Strict):
    """One rank's step (forward, backward, AdamW) measured on the cluster's accelerator (calibrate_cluster.py):
    step seconds = floor + batch x seconds a sample, fitted over several batch sizes."""
    arch: str
    forward_flops_per_sample: int = Field(gt=0, description="identifies the model and image size")
    precision: str
    full_seconds_per_sample: float = Field(gt=0.0, description="the dense model")
    lowrank_seconds_per_sample: float = Field(gt=0.0, description="every eligible weight factored")
    lowrank_params_ratio: float = Field(gt=0.0, le=1.0, description="the factored model's parameters / the dense one's")
    step_floor_seconds: float = Field(0.0, ge=0.0, description="the dense step's fixed cost (0: the seconds a "
                                                              "sample carry it, as calibrations before it wrote)")
    lowrank_step_floor_seconds: float = Field(0.0, ge=0.0, description="the factored step's fixed cost")
    device: str = ""


class PublishedRate(_Strict):
    """A public measurement of training throughput on the cluster's accelerator, with its source."""
    arch: str
    forward_flops_per_sample: int = Field(gt=0, description="identifies the model and image size (abtune's count)")
    precisions: list[Precision] = Field(min_length=1, description="the run precisions it stands for")
    as_published: str = Field(min_length=1, description="the precision and set-up as the source states them")
    images_per_s_per_gpu: float = Field(gt=0.0)
    batch_per_gpu: int = Field(ge=1)
    gpus: int = Field(ge=1, description="GPUs of the published run (more than one: its all-reduce is in the rate)")
    device: str
    source: str = Field(min_length=1, description="where the figure is published (a link)")
    note: str = ""


class SpecSheet(_Strict):
    """A card without published training rates, from its spec sheet: predicted as a roofline with per-family
    efficiencies (`FAMILY_ROOFLINES`) taken from the A100's published rows."""
    device: str = Field(min_length=1)
    match: str = Field("", description="a part of torch.cuda.get_device_name() that names this card")
    tflops: dict[Literal["fp32", "tf32", "bf16", "fp16"], float] = Field(
        description="dense peaks (no sparsity): fp32 on CUDA cores, tf32/bf16/fp16 on tensor cores")
    memory_gb_per_s: float = Field(gt=0.0, description="memory bandwidth, GB/s")
    source: str = Field(min_length=1, description="where the figures are published (a link)")

    @model_validator(mode="after")
    def _positive(self) -> SpecSheet:
        if not self.tflops or any(peak <= 0 for peak in self.tflops.values()):
            raise ValueError(f"spec_sheet.tflops needs positive peaks, got {self.tflops}")
        return self


class Compute(_Strict):
    from_run: bool = Field(False, description="the run's own step times (a description of the machine it ran on)")
    measured: list[MeasuredStep] = Field(default_factory=list)
    published: list[PublishedRate] = Field(default_factory=list)
    throughput: Throughput | None = None
    spec_sheet: SpecSheet | None = None
    step_floor_ms: float = Field(0.0, ge=0.0, description="a step's fixed cost (kernel launches, optimizer), "
                                                         "added to every step that is not from_run")
    step_floor_source: str = Field("", description="where the floor comes from: measured, published or assumed")
    backward_overlap: float = Field(2 / 3, ge=0.0, le=1.0,
                                    description="the share of a step's compute gradient all-reduces can hide behind")
    straggler_cv: float = Field(0.0, ge=0.0, le=1.0, description="one rank's step-time spread (standard deviation "
                                "over mean): a synchronous step waits for the slowest of its ranks")
    straggler_source: str = ""
    source: str = ""

    @model_validator(mode="after")
    def _one_way(self) -> Compute:
        others = [name for name, given in (("measured", self.measured), ("published", self.published),
                                           ("throughput", self.throughput), ("spec_sheet", self.spec_sheet),
                                           ("step_floor_ms", self.step_floor_ms))
                  if given]
        if self.from_run and others:
            raise ValueError(f"from_run takes the run's own step times, so {', '.join(others)} would be ignored; "
                             f"remove {'them' if len(others) > 1 else 'it'} or from_run")
        if not self.from_run and not (self.measured or self.published or self.throughput or self.spec_sheet):
            raise ValueError("compute needs from_run: true, measured steps, published rates or a throughput "
                             "(tflops, efficiency), or a spec_sheet (tflops, memory_gb_per_s, source)")
        if self.step_floor_ms and floor_kind(self.step_floor_source) not in FLOOR_KINDS:
            raise ValueError("step_floor_ms needs a step_floor_source that begins with measured (how), published "
                             f"(a link) or assumed (why), got {self.step_floor_source!r}")
        for rate in self.published:
            if self.step_floor_ms / 1e3 >= rate.batch_per_gpu / rate.images_per_s_per_gpu:
                raise ValueError(f"step_floor_ms {self.step_floor_ms:g} is as long as the published {rate.arch} step "
                                 f"({rate.batch_per_gpu} images at {rate.images_per_s_per_gpu:g}/s); lower it")
        return self


class Cluster(_Strict):
    name: str
    description: str = ""
    nodes: int = Field(ge=1)
    accelerators_per_node: int = Field(ge=1)
    inter_node: Link
    intra_node: Link
    compute: Compute


def resolve_cluster_path(name_or_path: str) -> Path:
    found = CLUSTERS.find(name_or_path)
    if found is not None:
        return found
    raise ConfigError(f"cluster {name_or_path}: no such description; choose one of {', '.join(cluster_names())} "
                      "or give the path of a YAML file (see clusters/ in the checkout)")


def cluster_names() -> list[str]:
    return CLUSTERS.names()


def load_cluster(name_or_path: str) -> Cluster:
    path = resolve_cluster_path(name_or_path)
    raw = read_yaml(path)
    try:
        return Cluster.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')}") from None


def with_link_rate(cluster: Cluster, gbit_per_s: float, efficiency: float | None = None) -> Cluster:
    """The same cluster with another inter-node rate (for break-even rates and the fabric check)."""
    link = {"gbit_per_s": gbit_per_s, **({"efficiency": efficiency} if efficiency is not None else {})}
    return cluster.model_copy(update={"inter_node": cluster.inter_node.model_copy(update=link)})


@dataclass
class PhaseTime:
    steps: int
    compute_s: float  # per step
    overlapped_s: float  # per step: gradient all-reduces
    blocking_s: float  # per step: the other collectives


@dataclass
class Prediction:
    cluster: str
    phases: dict[str, PhaseTime]
    step_seconds: dict[str, float]
    sync_seconds: float  # all of AB's syncs together
    train_seconds: float
    time_to_target_seconds: float | None
    compute_source: ComputeSource
    step_floor_seconds: float  # in every step's compute (0 with from_run: the run's steps hold their own)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "step_seconds": self.step_seconds, "sync_seconds": self.sync_seconds,
                "train_seconds": self.train_seconds, "time_to_target_seconds": self.time_to_target_seconds,
                "phases": {p: vars(t) for p, t in self.phases.items()},
                "compute_source": self.compute_source.kind, "compute_source_detail": self.compute_source.detail,
                "step_floor_seconds": self.step_floor_seconds, "notes": self.notes}


# --- communication ----------------------------------------------------------------------------------
def _packets(row: dict[str, Any], link: Link) -> float:
    """TCP packets for a row's inter-node bytes: full packets, and each message's three preambles in a
    packet of their own at worst."""
    sent = row["inter_node_bytes"] + row.get("inter_node_framing_bytes", 0)
    return sent / link.packet_payload_bytes + 3 * row.get("inter_node_messages", 0)


def collective_seconds(rows_by_rank: dict[int, dict[str, Any]], group_size: int, node_of_rank: tuple[int, ...],
                       cluster: Cluster) -> float:
    """The link time on the cluster of one collective row (all its calls) of every rank that ran it; groups of
    one family (AB's A and B groups) run at the same time and share their nodes' links."""
    inter, intra = cluster.inter_node, cluster.intra_node
    egress: dict[int, float] = defaultdict(float)
    for rank, row in rows_by_rank.items():
        egress[node_of_rank[rank]] += (row["inter_node_bytes"] + row.get("inter_node_framing_bytes", 0)
                                       + _packets(row, inter) * inter.header_bytes_per_packet)
    any_row = next(iter(rows_by_rank.values()))
    calls = any_row["calls"]
    per_call = int(any_row["payload_bytes"] / calls) if calls else 0
    rounds = calls * wire.rounds(any_row["op"], group_size, per_call)
    if any_row["locality"] == "inter":
        bandwidth = max(egress.values()) * 8 / (inter.gbit_per_s * inter.efficiency * GIGA)
        # the ring's hops inside a node run beside the ones that leave it, at the intra-node rate
        intra_bytes = max(max(0.0, r["wire_bytes"] - r["inter_node_bytes"]) for r in rows_by_rank.values())
        return max(bandwidth, intra_bytes * 8 / (intra.gbit_per_s * intra.efficiency * GIGA)) \
            + rounds * inter.latency_us * 1e-6
    intra_bytes = max(r["wire_bytes"] for r in rows_by_rank.values())
    return intra_bytes * 8 / (intra.gbit_per_s * intra.efficiency * GIGA) + rounds * intra.latency_us * 1e-6


def _family(group: str) -> str:
    return group.rstrip("0123456789")  # ab_group0, ab_group1 -> ab_group


def _group_rows(per_rank: list[list[dict[str, Any]]]) -> dict[tuple[str, str, str], tuple[dict[int, dict[str, Any]], int]]:
    """(phase, group family, op): every rank's row, and the size of one group of the family."""
    grouped: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    members: dict[str, set[int]] = defaultdict(set)
    for rank, rows in enumerate(per_rank):
        for row in rows:
            grouped[(row["phase"], _family(row["group"]), row["op"])][rank] = row
            members[row["group"]].add(rank)
    return {key: (rows, max(len(members[row["group"]]) for row in rows.values())) for key, rows in grouped.items()}


# --- compute ----------------------------------------------------------------------------------------
GUESSES = ("scaled", "spec sheet", "assumed")  # compute kinds that a prediction flags as not measured
FLOPS_MATCH = 0.01  # a rate is for the run's model when their forward FLOPs a sample agree this closely


@dataclass(frozen=True)
class ComputeSource:
    """Where a prediction's compute comes from: measured (a calibration, or the run itself), published (a
    public measurement, linked), scaled (the nearest measured or published model, by FLOPs) or assumed."""
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


FROM_RUN = ComputeSource("measured", "the run's own step times, on the machine it ran on")


@dataclass(frozen=True)
class StepCompute:
    """A step's compute on the cluster: floor_s + local batch x the seconds a sample of the phase's model."""
    floor_s: float
    seconds_per_sample: float  # the dense model
    source: ComputeSource
    factored: MeasuredStep | None = None  # a calibration's factored measurement, for AB's phase

    def seconds(self, batch: int, flops_ratio: float = 1.0) -> float:
        """A step of `batch` samples of a model with `flops_ratio` of the dense model's FLOPs."""
        return self.floor_s + batch * self.seconds_per_sample * flops_ratio


@dataclass(frozen=True)
class _Rate:
    """A measured or published rate in one shape: which model, its fixed cost and seconds a sample."""
    arch: str
    flops: int
    precisions: tuple[str, ...]
    compute: StepCompute


def phase_flops_ratio(summary: dict[str, Any], phase: str) -> float:
    """A phase's forward FLOPs a sample as a share of the dense model's: 1.0 but in AB's phase, where the
    factored weights' products count at the FLOPs their factored layers computed
    (`decompositions[i].product_flops_per_sample`, from the ranks the run chose), averaged over the AB phases
    by their steps; 1.0 for a summary without them.

    A dense count smaller than the products it contains was not taken as training runs the model (a summary
    written when FLOPs were counted in eval mode, where torchvision's fused attention went uncounted): such a
    phase stays at the dense count."""
    if phase != "ab":
        return 1.0
    dense = summary["timing"]["forward_flops_per_sample"]
    counted = [d for d in summary.get("decompositions", []) if "product_flops_per_sample" in d]
    if not counted:
        return 1.0
    ends = sorted({start for _, start in summary["timing"].get("phase_starts", [])}
                  | {d["step"] for d in summary["decompositions"]} | {summary["steps_done"]})
    steps = [next((end for end in ends if end > d["step"]), d["step"] + 1) - d["step"] for d in counted]
    products = [d["product_flops_per_sample"] for d in counted]
    shares = [1.0 + (p["factored"] - p["dense"]) / dense if p["dense"] <= dense else 1.0 for p in products]
    return sum(share * n for share, n in zip(shares, steps, strict=True)) / sum(steps)


def step_compute(summary: dict[str, Any], cluster: Cluster) -> StepCompute:
    """The compute of the run's steps on `cluster` and its source: the first of the module docstring's list
    that fits the run's model (arch and forward FLOPs a sample) and precision."""
    compute = cluster.compute
    if compute.from_run:
        return StepCompute(0.0, 0.0, FROM_RUN)
    arch, precision = summary["config"].get("model.arch"), summary["config"].get("train.precision")
    flops = summary["timing"]["forward_flops_per_sample"]
    rates = [r for r in _rates(cluster) if precision in r.precisions]
    exact = next((r for r in rates if r.arch == arch and abs(r.flops - flops) <= FLOPS_MATCH * flops), None)
    if exact is not None:
        return exact.compute
    kin = [r for r in rates if _arch_family(r.arch) == _arch_family(arch)]
    if kin:
        nearest = min(kin, key=lambda r: abs(math.log(flops / r.flops)))
        return _scaled(nearest, flops)
    if compute.spec_sheet is not None and precision in compute.spec_sheet.tflops:
        return _from_spec_sheet(compute, arch, precision, flops)
    peak = compute.throughput.peak(precision) if compute.throughput is not None else None
    if peak is None:
        raise ConfigError(f"cluster {cluster.name} has no measured or published rate for {arch} "
                          f"({flops:.3g} FLOPs a sample) or its family in {precision}, and no throughput for "
                          f"{precision}; calibrate it for this model (benchmarks/calibrate_cluster.py)")
    return _assumed(compute, peak, precision, flops)


def _rates(cluster: Cluster) -> list[_Rate]:
    """The cluster's calibrations, then its published rates (a calibration wins over a publication)."""
    compute = cluster.compute
    measured = [_Rate(m.arch, m.forward_flops_per_sample, (m.precision,), StepCompute(
        m.step_floor_seconds, m.full_seconds_per_sample,
        ComputeSource("measured", f"{m.arch} {m.precision} calibrated on {m.device or cluster.name}"
                                  + (f" ({compute.source})" if compute.source else "")), m))
        for m in compute.measured]
    floor = compute.step_floor_ms / 1e3
    published = [_Rate(p.arch, p.forward_flops_per_sample, tuple(p.precisions), StepCompute(
        floor, 1 / p.images_per_s_per_gpu / straggling(compute, p.gpus) - floor / p.batch_per_gpu, ComputeSource(
            "published", f"{p.arch} {p.images_per_s_per_gpu:g} images/s per GPU ({p.as_published}, batch "
                         f"{p.batch_per_gpu}, {p.gpus} GPU{'s' if p.gpus > 1 else ''}, {p.device}), {p.source}")))
        for p in compute.published]
    return measured + published


def _scaled(rate: _Rate, flops: int) -> StepCompute:
    ratio = flops / rate.flops
    source = ComputeSource("scaled", f"from {rate.arch} by forward FLOPs (x{ratio:.3g}); {rate.compute.source}")
    return StepCompute(rate.compute.floor_s, rate.compute.seconds_per_sample * ratio, source)


def _assumed(compute: Compute, peak: float, precision: str, flops: int) -> StepCompute:
    throughput = compute.throughput
    assert throughput is not None
    seconds = flops * (1 + BACKWARD_FLOPS_PER_FORWARD) / (peak * 1e12 * throughput.efficiency)
    detail = f"{throughput.efficiency:.0%} of {peak:g} TFLOP/s ({precision}) for 3 x the forward FLOPs a sample"
    return StepCompute(compute.step_floor_ms / 1e3, seconds, ComputeSource("assumed", detail))


@dataclass(frozen=True)
class FamilyRoofline:
    """How a family of models uses a card: the share of the tensor-core peak its step reaches, and the share
    of its step that waits on memory (elementwise work, normalisation: scales with bandwidth, not the peak),
    both measured on the reference card (A100-SXM4-40GB) from published rates."""
    efficiency: dict[str, float]  # by precision, of the reference's peak for that precision and family
    memory_share: float
    source: str


REFERENCE_CARD = SpecSheet(device="A100-SXM4-40GB", tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                           memory_gb_per_s=1555.0,
                           source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                                  "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_RN50_A100 = ("https://github.com/NVIDIA/DeepLearningExamples/blob/9061083098da527671529366315f5bc0e16493c4/"
              "PyTorch/Classification/ConvNets/resnet50v1.5/README.md")
_VIT_A100 = ("https://github.com/FlagOpen/FlagPerf/blob/c87aa312b9a4c64371d601fe712bb2e57acab98a/training/nvidia/"
             "vit-pytorch/README.md")
FAMILY_ROOFLINES = {
    # ResNet-50 8.178 GFLOP a sample: AMP 1240.81 images/s = 30.4 TFLOP/s of 312; TF32 680.15 = 16.7 of 156.
    # memory share 0.95: fitted to the same README's V100-16GB rows (AMP 856.52, FP32 373.21), within 20%
    "conv": FamilyRoofline({"bf16": 0.0976, "fp16": 0.0976, "fp32": 0.1070}, 0.95,
                           f"ResNet-50 on A100 ({_RN50_A100}); memory share fitted to its V100 rows"),
    # ViT-B/16 35.13 GFLOP a sample: AMP 680.125 images/s = 71.7 TFLOP/s of 312; fp32 unpublished (assumed
    # the same share of fp32's peak); memory share 0.1 assumed (its step is matrix products)
    "transformer": FamilyRoofline({"bf16": 0.2297, "fp16": 0.2297, "fp32": 0.2297}, 0.10,
                                  f"ViT-B/16 on A100 ({_VIT_A100}); memory share assumed"),
}
CONV_ARCHS = ("resnet", "vgg", "small")  # _arch_family's names; everything else is a transformer (vit)


def model_family(arch: str) -> str:
    return "conv" if _arch_family(arch) in CONV_ARCHS else "transformer"


def _peak(sheet: SpecSheet, family: str, precision: str) -> float:
    """The peak a family's fp32 step runs at: convolutions in TF32 where the card has it (PyTorch's default),
    matrix products in IEEE fp32 (allow_tf32 is off for them since PyTorch 1.12)."""
    if precision == "fp32" and family == "conv" and "tf32" in sheet.tflops:
        return sheet.tflops["tf32"]
    return sheet.tflops[precision]


def roofline_seconds_per_sample(sheet: SpecSheet, arch: str, precision: str, flops: int) -> float:
    """3 x forward FLOPs a sample over the card's peak at the family's efficiency, the family's memory share of
    that time scaled by the reference card's bandwidth over this card's instead of by the peaks."""
    family = model_family(arch)
    roofline = FAMILY_ROOFLINES[family]
    at_reference = flops * (1 + BACKWARD_FLOPS_PER_FORWARD) / (
        _peak(REFERENCE_CARD, family, precision) * 1e12 * roofline.efficiency[precision])
    compute = (1 - roofline.memory_share) * _peak(REFERENCE_CARD, family, precision) / _peak(sheet, family, precision)
    memory = roofline.memory_share * REFERENCE_CARD.memory_gb_per_s / sheet.memory_gb_per_s
    return at_reference * (compute + memory)


def _from_spec_sheet(compute: Compute, arch: str, precision: str, flops: int) -> StepCompute:
    sheet = compute.spec_sheet
    assert sheet is not None
    family = model_family(arch)
    seconds = roofline_seconds_per_sample(sheet, arch, precision, flops)
    detail = (f"{sheet.device} {_peak(sheet, family, precision):g} TFLOP/s ({precision}), {sheet.memory_gb_per_s:g} GB/s "
              f"({sheet.source}); {family} roofline: {FAMILY_ROOFLINES[family].source}")
    return StepCompute(compute.step_floor_ms / 1e3, seconds, ComputeSource("spec sheet", detail))


def expected_slowest(ranks: int) -> float:
    """The expected largest of `ranks` independent standard normal draws (Blom's approximation; 0 for one)."""
    return NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25)) if ranks > 1 else 0.0


def straggling(compute: Compute, ranks: int) -> float:
    """A synchronous step of `ranks` ranks over one rank's mean: mean + cv x mean x the expected slowest of N."""
    return 1.0 + compute.straggler_cv * expected_slowest(ranks)


def _arch_family(arch: str) -> str:
    """vit and vit_b_16 -> vit, resnet18 and resnet50 -> resnet: the same layers, so FLOPs scale their time."""
    match = re.match(r"[a-z]+", arch)
    return match.group(0) if match else arch


def _interpolate(step: MeasuredStep, share: float, batch: int) -> float:
    """A step of a model with `share` of the dense parameters: on the line through the factored and the dense
    measurement (compute of a factored layer grows with its rank, so with its parameters)."""
    dense = step.step_floor_seconds + batch * step.full_seconds_per_sample
    if step.lowrank_params_ratio >= 1.0:
        return dense
    factored = step.lowrank_step_floor_seconds + batch * step.lowrank_seconds_per_sample
    return dense - (dense - factored) * (1.0 - share) / (1.0 - step.lowrank_params_ratio)


def _phase_compute_seconds(summary: dict[str, Any], phase: str, compute: StepCompute) -> float:
    timing = summary["timing"]
    if compute.source is FROM_RUN:
        measured = timing["by_phase"][phase]
        return measured["seconds"] / measured["steps"]
    batch = timing["local_batch_size"]
    if compute.factored is not None and phase == "ab":  # a calibration measured the factored model too
        counts = summary["compression"]
        return _interpolate(compute.factored, counts["trained_model_params"] / counts["dense_params"], batch)
    return compute.seconds(batch, phase_flops_ratio(summary, phase))


def _notes(cluster: Cluster, compute: StepCompute, phases: dict[str, PhaseTime]) -> list[str]:
    """What a user must read beside the figures: compute that is a guess, and steps that are mostly the floor.
    Worded without the run's own numbers, so that the runs of one comparison share them."""
    notes = []
    if compute.source.kind in GUESSES:
        notes.append(f"compute on {cluster.name} is not measured ({compute.source.kind}); calibrate a node "
                     "(benchmarks/calibrate_cluster.py) for a measured figure")
    if compute.source is FROM_RUN or not phases:
        return notes
    shortest = min(phase.compute_s for phase in phases.values())
    floor = compute.floor_s
    if floor and shortest <= 2 * floor:
        notes.append(f"predicted steps on {cluster.name} are mostly its per-step floor ({floor * 1e3:.3g} ms, "
                     f"{floor_kind(cluster.compute.step_floor_source)}): the model computes less than that a step")
    elif not floor and shortest < MIN_REAL_STEP_S:
        notes.append(f"predicted steps on {cluster.name} compute in under {MIN_REAL_STEP_S * 1e3:g} ms, less than "
                     "any real GPU step (kernel launches, optimizer), and its description sets no step_floor_ms; "
                     "calibrate a node for one")
    return notes


def floor_kind(source: str) -> str:
    """measured, published or assumed: the word a step_floor_source begins with."""
    return source.split(":")[0].split()[0] if source.strip() else ""


# --- the model --------------------------------------------------------------------------------------
def check_fits(nodes: int, per_node: int, cluster: Cluster) -> None:
    if nodes > cluster.nodes or per_node > cluster.accelerators_per_node:
        raise ConfigError(f"the run's {nodes} node(s) x {per_node} rank(s) do not fit cluster {cluster.name} "
                          f"({cluster.nodes} x {cluster.accelerators_per_node}); train it at a layout that fits")


def placement(summary: dict[str, Any], cluster: Cluster) -> tuple[int, ...]:
    """The run's ranks on the cluster's nodes as they were on its own: a block of ranks_per_node per node."""
    check_fits(summary["num_nodes"], summary["ranks_per_node"], cluster)
    return tuple(rank // summary["ranks_per_node"] for rank in range(summary["world_size"]))


def predict(summary: dict[str, Any], cluster: Cluster) -> Prediction:
    """The run's training time on `cluster` (summary: summary.json as a dict)."""
    timing = summary.get("timing", {})
    if "by_phase" not in timing:
        raise ConfigError("the run's summary has no per-phase step times (it predates abtune's time model); "
                          "train it again to predict its time on a cluster")
    node_of_rank = placement(summary, cluster)
    comm: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # phase: [overlapped, blocking] seconds
    buckets: dict[str, int] = {}  # phase: calls of its gradient all-reduce (DDP's buckets, all steps)
    for (phase, family, op), (rows, group_size) in _group_rows(summary["traffic"]["rows_per_rank"]).items():
        if phase not in TRAINING_PHASES:
            continue
        seconds = collective_seconds(rows, group_size, node_of_rank, cluster)
        # DDP's gradient buckets; in AB's group phase the world all-reduce is the rank agreement, not gradients
        if op == "all_reduce" and Phase(phase).overlapped and not (phase == Phase.AB and family == "world"):
            comm[phase][0] += seconds
            buckets[phase] = max(buckets.get(phase, 0), next(iter(rows.values()))["calls"])
        else:
            comm[phase][1] += seconds
    compute = step_compute(summary, cluster)
    phases, step_seconds = {}, {}
    for phase, measured in timing["by_phase"].items():
        steps = measured["steps"]
        compute_s = _phase_compute_seconds(summary, phase, compute)
        if compute.source is not FROM_RUN:  # a run's own steps already waited for its slowest rank
            compute_s *= straggling(cluster.compute, summary["world_size"])
        overlapped, blocking = (seconds / steps for seconds in comm.get(phase, [0.0, 0.0]))
        phases[phase] = PhaseTime(steps, compute_s, overlapped, blocking)
        per_step = max(1, round(buckets.get(phase, steps) / steps))
        step_seconds[phase] = overlapped_step(compute_s, overlapped, per_step, cluster.compute.backward_overlap) + blocking
    sync = sum(comm.get(Phase.SYNC, [0.0, 0.0]))
    train = sum(step_seconds[p] * t.steps for p, t in phases.items()) + sync
    return Prediction(cluster.name, phases, step_seconds, sync, train, _time_to_target(summary, step_seconds, sync, train),
                      compute.source, compute.floor_s, _notes(cluster, compute, phases))


def overlapped_step(compute: float, all_reduce: float, buckets: int, backward_share: float) -> float:
    """A step whose `buckets` gradient all-reduces (`all_reduce` seconds of link in all) start as the backward
    fills them (the module's docstring)."""
    each, end = all_reduce / buckets, 0.0
    for j in range(1, buckets + 1):
        ready = (1 - backward_share + backward_share * j / buckets) * compute
        end = max(ready, end) + each
    return max(compute, end)


def _time_to_target(summary: dict[str, Any], step_seconds: dict[str, float], sync: float, train: float) -> float | None:
    """Predicted seconds until the step at which the run first reached train.target_top1 (AB's syncs spread
    over the run by steps); None without a target, inf when never reached."""
    target = summary["timing"].get("target_top1")
    if target is None:
        return None
    reached = next((row["step"] for row in summary["history"] if row["val_top1"] >= target), None)
    if reached is None:
        return math.inf
    starts = summary["timing"].get("phase_starts") or []
    ends = [start for _, start in starts[1:]] + [summary["steps_done"]]
    seconds = sum(step_seconds[phase] * max(0, min(end, reached) - start)
                  for (phase, start), end in zip(starts, ends, strict=True))
    return seconds + sync * reached / max(1, summary["steps_done"])


def break_even_gbit(ab: dict[str, Any], ddp: dict[str, Any], cluster: Cluster) -> float | None:
    """The inter-node rate at which ab's predicted training time equals ddp's (ab is faster below it);
    None when one is faster at every rate from 0.01 to 10,000 Gbit/s."""
    def gap(rate: float) -> float:
        linked = with_link_rate(cluster, rate)
        return predict(ab, linked).train_seconds - predict(ddp, linked).train_seconds

    low, high = math.log10(0.01), math.log10(10_000.0)
    if (gap(10 ** low) < 0) == (gap(10 ** high) < 0):
        return None
    for _ in range(60):
        middle = (low + high) / 2
        if (gap(10 ** middle) < 0) == (gap(10 ** low) < 0):
            low = middle
        else:
            high = middle
    return 10 ** ((low + high) / 2)



# --- a run before it starts ---------------------------------------------------------------------------
GRADIENT_BYTES_PER_PARAM = 4  # fp32 gradients, also under bf16 autocast
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


@dataclass(frozen=True)
class PlannedRun:
    """What a run's training time depends on, known before it starts (its model counted, not trained)."""
    arch: str
    forward_flops_per_sample: int
    params: int
    precision: str
    local_batch_size: int
    steps: int
    nodes: int
    ranks_per_node: int


@dataclass(frozen=True)
class RunEstimate:
    step_seconds: float
    seconds: float
    compute_source: ComputeSource
    all_reduce_seconds: float  # a step's gradient all-reduce, link time


def estimate_run(run: PlannedRun, cluster: Cluster, ranks_per_core: float = 1.0) -> RunEstimate:
    """A run's training seconds on `cluster` before it runs, as DDP trains it (AB's phases compute and send
    less, so this bounds an AB run from above): a step's compute (`step_compute`, times `ranks_per_core` when
    ranks share cores) and the ring all-reduce of its fp32 gradients in DDP's buckets, overlapped as `predict`
    does. Evaluation and set-up are left out, as in `predict`."""
    if cluster.compute.from_run:
        raise ConfigError(f"cluster {cluster.name} takes its compute from a finished run's step times; name a "
                          "description with measured, published or spec-sheet compute for an estimate before a run")
    check_fits(run.nodes, run.ranks_per_node, cluster)
    summary = {"config": {"model.arch": run.arch, "train.precision": run.precision},
               "timing": {"forward_flops_per_sample": run.forward_flops_per_sample}}
    compute = step_compute(summary, cluster)
    ranks = run.nodes * run.ranks_per_node
    compute_s = compute.seconds(run.local_batch_size) * max(1.0, ranks_per_core) * straggling(cluster.compute, ranks)
    gradient_bytes = run.params * GRADIENT_BYTES_PER_PARAM
    link_s = ring_all_reduce_seconds(gradient_bytes, run.nodes, run.ranks_per_node, cluster)
    buckets = max(1, math.ceil(gradient_bytes / DDP_BUCKET_BYTES))
    step = overlapped_step(compute_s, link_s, buckets, cluster.compute.backward_overlap)
    return RunEstimate(step, step * run.steps, compute.source, link_s)


def ring_all_reduce_seconds(nbytes: int, nodes: int, ranks_per_node: int, cluster: Cluster) -> float:
    """A ring all-reduce of `nbytes` over nodes x ranks_per_node ranks (a node's ranks adjacent in the ring):
    each rank, and each node's link, sends 2(n-1)/n of the bytes; 2(n-1) rounds of latency."""
    size = nodes * ranks_per_node
    if size == 1:
        return 0.0
    sent = 2 * (size - 1) / size * nbytes * 8
    link = cluster.inter_node if nodes > 1 else cluster.intra_node
    seconds = sent / (link.gbit_per_s * link.efficiency * GIGA)
    if nodes > 1:  # the ring's hops inside a node run beside the ones that leave it
        intra = cluster.intra_node
        seconds = max(seconds, sent / (intra.gbit_per_s * intra.efficiency * GIGA))
    return seconds + 2 * (size - 1) * link.latency_us * 1e-6


def measured_here(arch: str, forward_flops_per_sample: int, precision: str, seconds_per_sample: float,
                  ranks: int, how: str) -> Cluster:
    """A description of this machine from a probe of one model: `ranks` local processes, compute measured."""
    step = MeasuredStep(arch=arch, forward_flops_per_sample=forward_flops_per_sample, precision=precision,
                        full_seconds_per_sample=seconds_per_sample, lowrank_seconds_per_sample=seconds_per_sample,
                        lowrank_params_ratio=1.0, device="this machine")
    loopback = Link(gbit_per_s=20.0)
    return Cluster(name="this machine", nodes=1, accelerators_per_node=max(1, ranks), inter_node=loopback,
                   intra_node=loopback, compute=Compute(measured=[step], source=how))


def spec_sheet_for(device_name: str) -> Cluster | None:
    """The description (a project's or a shipped one) whose spec sheet names this GPU (`match`), or None."""
    for name in cluster_names():
        cluster = load_cluster(name)
        sheet = cluster.compute.spec_sheet
        if sheet is not None and sheet.match and sheet.match.lower() in device_name.lower():
            return cluster
    return None


# --- how sure a comparison is -------------------------------------------------------------------------
# The model's stated relative uncertainty of a predicted training time, by its compute's source: measured and
# published compute put images/s within 3.2% of published multi-GPU figures and the all-reduce 10-13% above
# NCCL's bus bandwidth (BENCHMARKS.md, "Predicted time beside published figures"): 15%; a spec sheet put V100's
# ResNet-50 within 20% (its fit) and a scaled rate carries the FLOPs ratio's error: 30%; an assumed share of
# the peak is off by 2-3x between ResNet-50 and ViT-B/16 on the A100: 50%.
UNCERTAINTY = {"measured": 0.15, "published": 0.15, "scaled": 0.30, "spec sheet": 0.30, "assumed": 0.50}
RATE_GRID = tuple(10 ** (exponent / 4) for exponent in range(-8, 17))  # 0.01 to 10,000 Gbit/s, 4 a decade


@dataclass(frozen=True)
class Separation:
    """Where two runs' predicted times differ by more than the model's uncertainty, over inter-node rates."""
    uncertainty: float  # relative, of the less certain prediction
    break_even_gbit: float | None
    ab_faster: tuple[float, float] | None  # the lowest and highest grid rate where ab is faster beyond it
    ddp_faster: tuple[float, float] | None


def uncertainty_of(*predictions: Prediction) -> float:
    return max(UNCERTAINTY[p.compute_source.kind] for p in predictions)


def separation(ab: dict[str, Any], ddp: dict[str, Any], cluster: Cluster) -> Separation:
    """ab against ddp at each rate of RATE_GRID: faster only where the gap exceeds the uncertainty of the
    slower prediction (a difference below it is not a difference the model can tell)."""
    ab_rates, ddp_rates, uncertainty = [], [], 0.0
    for rate in RATE_GRID:
        linked = with_link_rate(cluster, rate)
        ab_at, ddp_at = predict(ab, linked), predict(ddp, linked)
        share = uncertainty_of(ab_at, ddp_at)
        uncertainty = max(uncertainty, share)
        gap = ab_at.train_seconds - ddp_at.train_seconds
        if abs(gap) > share * max(ab_at.train_seconds, ddp_at.train_seconds):
            (ab_rates if gap < 0 else ddp_rates).append(rate)
    span = lambda rates: (min(rates), max(rates)) if rates else None  # noqa: E731
    return Separation(uncertainty, break_even_gbit(ab, ddp, cluster), span(ab_rates), span(ddp_rates))
