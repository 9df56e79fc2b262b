"""Time on a user's cluster: a step-time model from a run's exact byte and message counts.

A finished run knows, per phase, how many steps it trained and how long they took here, and per rank
every collective's bytes and gloo messages to other nodes (`abtune.comm`, `abtune.wire`). A cluster
description (clusters/NAME.yaml) says what the user's nodes have. The model puts the two together; each
line of it can be checked by hand:

    link seconds of a collective = max over nodes of (the node's ranks' inter-node bytes + gloo framing
                                   + packet headers) x 8 / inter-node rate
                                 + calls x rounds of its algorithm x latency        (alpha-beta)
    compute seconds of a step    = the run's own step time here (`compute.from_run`), or
                                   local batch x seconds a sample measured on the cluster's accelerator for
                                   the model and precision, between its dense and factored measurements by
                                   the phase's parameters                            (`compute.measured`), or
                                   3 x forward FLOPs a sample x local batch / (TFLOP/s x efficiency), in an
                                   AB phase with the factored layers' products at the ranks the run chose
                                   (`ab_forward_flops_share`)                       (`compute.throughput`)
    step seconds of a phase      = when DDP's last gradient bucket is all-reduced (see overlap)
                                   + blocking collectives
    train seconds                = sum over phases of steps x step seconds, + AB's syncs

Overlap: DDP all-reduces a bucket of gradients as soon as the backward pass has filled it, while the
backward goes on. With k buckets a step (the gradient all-reduce row's calls per step), each taking c of
link time, bucket j is ready at (1 - b + b j / k) x compute (b = `compute.backward_overlap`, the backward's
share of a step's compute) and the link takes them in order: end_j = max(ready_j, end_j-1) + c, and the
step ends at max(compute, end_k). One bucket (every small model) overlaps nothing: compute + c. These are
the gradient all-reduces of the training phases (ddp, fp16, powersgd, AB's full-rank and group phases);
every other collective (AB's syncs, SBC's all-gathers) blocks. Intra-node collectives cost their bytes at the intra-node rate. The run's
placement is kept: its nodes and ranks per node must fit the cluster's. Evaluation, checkpoint and
set-up traffic are not training time (as train_seconds) and are left out.

Torch-free: `abtune compare --cluster` and the study objective read it beside summaries.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from abtune import wire
from abtune.errors import ConfigError
from abtune.yamlfile import find_named, names_in, read_yaml

_PACKAGE_DIR = Path(__file__).resolve().parent
_INSTALLED_DIR = _PACKAGE_DIR / "clusters"
BUILTIN_DIR = _INSTALLED_DIR if _INSTALLED_DIR.is_dir() else _PACKAGE_DIR.parent / "clusters"
PROJECT_DIR = Path("clusters")
OVERLAPPED_PHASES = ("train", "warmup", "ab", "rebound")  # where DDP's gradient all-reduces run
TRAINING_TIME_PHASES = (*OVERLAPPED_PHASES, "sync")
BACKWARD_FLOPS_PER_FORWARD = 2.0  # a step: one forward, a backward of about twice its FLOPs
GIGA = 1e9


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Link(_Strict):
    gbit_per_s: float = Field(gt=0.0, description="rate each way, per node (inter) or per rank (intra)")
    latency_us: float = Field(0.0, ge=0.0, description="one way")
    efficiency: float = Field(1.0, gt=0.0, le=1.0, description="the share of the rate a transfer sustains")
    header_bytes_per_packet: int = Field(66, ge=0, description="Ethernet + IPv4 + TCP with timestamps: 66")
    packet_payload_bytes: int = Field(1448, ge=1, description="TCP's MSS on a 1500-byte MTU: 1448")


class Throughput(_Strict):
    tflops: float = Field(gt=0.0, description="the accelerator's peak for the run's precision")
    efficiency: float = Field(gt=0.0, le=1.0, description="the share of the peak a training step reaches")


class MeasuredStep(_Strict):
    """One rank's step (forward, backward, AdamW) measured on the cluster's accelerator (calibrate_cluster.py)."""
    arch: str
    forward_flops_per_sample: int = Field(gt=0, description="identifies the model and image size")
    precision: str
    full_seconds_per_sample: float = Field(gt=0.0, description="the dense model")
    lowrank_seconds_per_sample: float = Field(gt=0.0, description="every eligible weight factored")
    lowrank_params_ratio: float = Field(gt=0.0, le=1.0, description="the factored model's parameters / the dense one's")
    device: str = ""


class Compute(_Strict):
    from_run: bool = Field(False, description="the run's own step times (a description of the machine it ran on)")
    measured: list[MeasuredStep] = Field(default_factory=list)
    throughput: Throughput | None = None
    backward_overlap: float = Field(2 / 3, ge=0.0, le=1.0,
                                    description="the share of a step's compute gradient all-reduces can hide behind")
    source: str = ""


class Cluster(_Strict):
    name: str
    description: str = ""
    nodes: int = Field(ge=1)
    accelerators_per_node: int = Field(ge=1)
    inter_node: Link
    intra_node: Link
    compute: Compute


def resolve_cluster_path(name_or_path: str) -> Path:
    found = find_named(name_or_path, (PROJECT_DIR, BUILTIN_DIR))
    if found is not None:
        return found
    raise ConfigError(f"cluster {name_or_path}: no such description; choose one of {', '.join(cluster_names())} "
                      "or give the path of a YAML file (see clusters/ in the checkout)")


def cluster_names() -> list[str]:
    return names_in((PROJECT_DIR, BUILTIN_DIR))


def load_cluster(name_or_path: str) -> Cluster:
    path = resolve_cluster_path(name_or_path)
    raw = read_yaml(path)
    try:
        cluster = Cluster.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
    compute = cluster.compute
    if not compute.from_run and compute.throughput is None and not compute.measured:
        raise ConfigError(f"{path}: compute needs from_run: true, measured steps or a throughput (tflops, efficiency)")
    return cluster


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
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "step_seconds": self.step_seconds, "sync_seconds": self.sync_seconds,
                "train_seconds": self.train_seconds, "time_to_target_seconds": self.time_to_target_seconds,
                "phases": {p: vars(t) for p, t in self.phases.items()}}


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
def _compute_seconds(summary: dict[str, Any], phase: str, cluster: Cluster) -> float:
    timing = summary["timing"]
    measured = timing["by_phase"][phase]
    if cluster.compute.from_run:
        return measured["seconds"] / measured["steps"]
    compression = summary["compression"]
    if (step := _measured_step(summary, cluster)) is not None:
        share = compression["trained_model_params"] / compression["dense_params"] if phase == "ab" else 1.0
        return timing["local_batch_size"] * _interpolate(step, share)
    throughput = cluster.compute.throughput
    if throughput is None:
        raise ConfigError(f"cluster {cluster.name} has no measured step for {summary['config'].get('model.arch')} "
                          f"({timing['forward_flops_per_sample']:.3g} FLOPs a sample) in "
                          f"{summary['config'].get('train.precision')} and no throughput; calibrate it for this model")
    forward = timing["forward_flops_per_sample"] * (ab_forward_flops_share(summary) if phase == "ab" else 1.0)
    flops = forward * (1 + BACKWARD_FLOPS_PER_FORWARD) * timing["local_batch_size"]
    return flops / (throughput.tflops * 1e12 * throughput.efficiency)


def ab_forward_flops_share(summary: dict[str, Any]) -> float:
    """An AB phase's forward FLOPs a sample as a share of the dense model's: the factored weights' products at
    the FLOPs their factored layers computed (`decompositions[i].product_flops_per_sample`, from the ranks
    the run chose), averaged over the AB phases by their steps; 1.0 for a summary without them.

    A dense count smaller than the products it contains was not taken as training runs the model (in eval
    mode torchvision's attention runs fused, uncounted): such a phase stays at the dense count."""
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


def _measured_step(summary: dict[str, Any], cluster: Cluster) -> MeasuredStep | None:
    flops, config = summary["timing"]["forward_flops_per_sample"], summary["config"]
    return next((m for m in cluster.compute.measured if m.arch == config.get("model.arch")
                 and m.precision == config.get("train.precision")
                 and abs(m.forward_flops_per_sample - flops) <= 0.01 * flops), None)


def _interpolate(step: MeasuredStep, share: float) -> float:
    """Seconds a sample with `share` of the dense parameters: on the line through the factored and the dense
    measurement (compute of a factored layer grows with its rank, so with its parameters)."""
    if step.lowrank_params_ratio >= 1.0:
        return step.full_seconds_per_sample
    slope = (step.full_seconds_per_sample - step.lowrank_seconds_per_sample) / (1.0 - step.lowrank_params_ratio)
    return step.full_seconds_per_sample - slope * (1.0 - share)


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
        if phase not in TRAINING_TIME_PHASES:
            continue
        seconds = collective_seconds(rows, group_size, node_of_rank, cluster)
        # DDP's gradient buckets; in AB's group phase the world all-reduce is the rank agreement, not gradients
        if op == "all_reduce" and phase in OVERLAPPED_PHASES and not (phase == "ab" and family == "world"):
            comm[phase][0] += seconds
            buckets[phase] = max(buckets.get(phase, 0), next(iter(rows.values()))["calls"])
        else:
            comm[phase][1] += seconds
    phases, step_seconds = {}, {}
    for phase, measured in timing["by_phase"].items():
        steps = measured["steps"]
        compute = _compute_seconds(summary, phase, cluster)
        overlapped, blocking = (seconds / steps for seconds in comm.get(phase, [0.0, 0.0]))
        phases[phase] = PhaseTime(steps, compute, overlapped, blocking)
        per_step = max(1, round(buckets.get(phase, steps) / steps))
        step_seconds[phase] = overlapped_step(compute, overlapped, per_step, cluster.compute.backward_overlap) + blocking
    sync = sum(comm.get("sync", [0.0, 0.0]))
    train = sum(step_seconds[p] * t.steps for p, t in phases.items()) + sync
    return Prediction(cluster.name, phases, step_seconds, sync, train, _time_to_target(summary, step_seconds, sync, train))


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
