"""The run summary: accuracy, compression, traffic (per phase, group, intra/inter node), timing;
on the emulated interconnect, the launcher adds the bytes the links really carried (`add_measured_traffic`).

Traffic is per rank; ranks differ (an A group all-reduces A's gradients, a B group B's), so every
rank's counters are gathered (one metered all-gather) and the summary gives their mean and max.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from abtune import strict_device
from abtune.comm import CommMeter, Op, all_gather_bytes, sum_rows, wire_factor
from abtune.config import flatten
from abtune.methods.base import Method, ParameterCounts
from abtune.models import forward_flops_per_sample
from abtune.phases import TRAINING_PHASES, Phase
from abtune.timing import predict

if TYPE_CHECKING:
    from abtune.comm import CommGroup, Topology
    from abtune.config import RunConfig
    from abtune.data import DatasetInfo
    from abtune.timing import Cluster
    from abtune.training.state import TrainState

INTER = "inter_node_bytes"
MESSAGES, FRAMING = "inter_node_messages", "inter_node_framing_bytes"
GIGA = 1e9
# Equation 4 of the AB paper as its Table 2 reads it: near full rank for 25% of training (F), at the
# final compression for the other 75% (L); c = 1 / compression ratio.
ECR_FULL_RANK_SHARE, ECR_COMPRESSED_SHARE = 0.25, 0.75


def gather_rows(meter: CommMeter, world: CommGroup, device: Any) -> list[list[dict[str, Any]]]:
    """Every rank's meter rows, via a metered all-gather of their JSON. The rows each rank sent could
    not hold that gather itself; it is the same on every rank (world all-gathers of the same sizes),
    so it is added to each from this rank's count, with the bytes that rank sent to other nodes."""
    meter.phase = Phase.REPORT
    mine = json.dumps(meter.rows()).encode()
    blobs = all_gather_bytes(meter, mine, world, device)
    per_rank = [json.loads(blob) for blob in blobs]
    report = [row for row in meter.rows() if row["phase"] == Phase.REPORT]
    for rank, rows in enumerate(per_rank):
        rows[:] = [row for row in rows if row["phase"] != Phase.REPORT] + [
            _as_sent_by(meter, rank, row, world.ranks) for row in report]
    return per_rank


def _as_sent_by(meter: CommMeter, rank: int, row: dict[str, Any], ranks: tuple[int, ...]) -> dict[str, Any]:
    """A world all-gather row of this rank as `rank` sent it (the report's gather: one call of each size)."""
    inter = messages = framing = 0.0
    gathers = 2  # all_gather_bytes: the lengths (int64s), then the padded messages
    lengths = len(ranks) * 8
    for size in (lengths, row["payload_bytes"] - lengths) if row["calls"] == gathers else (row["payload_bytes"],):
        op = Op(row["op"])
        inter += meter.topology.inter_node_bytes(rank, op, size, ranks)
        sent, framed = meter.topology.inter_node_messages(rank, op, size, ranks)
        messages, framing = messages + sent, framing + framed
    return {**row, "inter_node_bytes": inter, "inter_node_messages": int(messages), "inter_node_framing_bytes": framing}


def estimated_communication_reduction(ratio: float, full_rank_share: float = ECR_FULL_RANK_SHARE,
                                      compressed_share: float = ECR_COMPRESSED_SHARE) -> float:
    """ECR = 100% - F - L c (equation 4), in percent, for a model compressed `ratio`:1."""
    return 100.0 * (1.0 - full_rank_share - compressed_share / ratio)


def traffic_summary(per_rank: list[list[dict[str, Any]]], steps: int, seconds: float, node_of_rank: tuple[int, ...],
                    ddp_step_bytes: float) -> dict[str, Any]:
    def stats(key: str = "wire_bytes", **match: str) -> dict[str, float]:
        values = [sum_rows(rows, key, **match) for rows in per_rank]
        return {"mean": sum(values) / len(values), "max": max(values)}

    phases = sorted({r["phase"] for rows in per_rank for r in rows})
    training_bytes = sum(stats(phase=p)["mean"] for p in phases if p in TRAINING_PHASES)
    inter_training = sum(stats(INTER, phase=p)["mean"] for p in phases if p in TRAINING_PHASES)
    intra = [max(0.0, sum_rows(rows) - sum_rows(rows, INTER)) for rows in per_rank]
    other = [p for p in phases if p not in TRAINING_PHASES]
    ddp_reference = steps * ddp_step_bytes
    ddp_reference_inter = ddp_reference * _ring_hops_leaving_nodes(node_of_rank) / len(node_of_rank)
    return {
        "note": "wire bytes sent per rank (ring estimates); inter-node: the part sent to another node "
                "(gloo's ring and tree); mean and max over ranks. total_bytes, inter_node_bytes "
                "and intra_node_bytes count every phase; training_* count the training phases only "
                f"({', '.join(TRAINING_PHASES)}), non_training_* the others; GB/s is training bytes per training second",
        "total_bytes": stats(),
        "inter_node_bytes": stats(INTER),
        "intra_node_bytes": {"mean": sum(intra) / len(intra), "max": max(intra)},
        "inter_node_bytes_by_node": _by_node([sum_rows(rows, INTER) for rows in per_rank], node_of_rank),
        # gloo's messages across nodes and the preambles around them (abtune/wire.py), every phase
        "inter_node_messages": stats(MESSAGES),
        "inter_node_framing_bytes_by_node": _by_node([sum_rows(rows, FRAMING) for rows in per_rank], node_of_rank),
        "by_phase": {p: {"total": stats(phase=p), "inter": stats(INTER, phase=p)} for p in phases},
        "per_step_bytes": training_bytes / max(1, steps),
        "training_inter_node_gb_per_s": inter_training / GIGA / seconds if seconds else 0.0,
        "ddp_reference_bytes": ddp_reference,
        "ddp_reference_inter_node_bytes": ddp_reference_inter,
        "training_bytes": training_bytes,
        "training_inter_node_bytes": inter_training,
        "non_training_bytes": {p: stats(phase=p)["mean"] for p in other},
        "non_training_inter_node_bytes": {p: stats(INTER, phase=p)["mean"] for p in other},
        "reduction_vs_ddp": ddp_reference / training_bytes if training_bytes else float("inf"),
        "inter_node_reduction_vs_ddp": (ddp_reference_inter / inter_training if inter_training else float("inf"))
        if ddp_reference_inter else None,
        "rows_per_rank": per_rank,
    }


def intra_node_bytes(meter: CommMeter, inter_key: str = INTER) -> float:
    """Wire bytes not sent to another node (by `inter_key`: this rank's own, or its groups' mean). Wire
    bytes of a broadcast are the mean over the group ((n-1)/n x payload), while its root really sends
    the payload to each child: clamped at 0 for it."""
    return max(0.0, meter.total() - meter.total(inter_key))


def _by_node(values: list[float], node_of_rank: tuple[int, ...]) -> list[float]:
    totals = [0.0] * (max(node_of_rank) + 1)
    for value, node in zip(values, node_of_rank, strict=True):
        totals[node] += value
    return totals


def _ring_hops_leaving_nodes(node_of_rank: tuple[int, ...]) -> int:
    """Hops of a ring over all ranks (DDP's all-reduce) whose two ends sit on different nodes."""
    size = len(node_of_rank)
    return sum(node_of_rank[r] != node_of_rank[(r + 1) % size] for r in range(size)) if size > 1 else 0


def add_measured_traffic(summary: dict[str, Any], tx_bytes: list[int], rx_bytes: list[int],
                         tx_packets: list[int], header_bytes: int) -> None:
    """The bytes each node's link really carried (kernel counters of the emulated interconnect), beside
    the model: `payload` drops `header_bytes` per packet (Ethernet, IP, TCP headers) to compare like with like."""
    traffic = summary["traffic"]
    modelled = sum(traffic["inter_node_bytes_by_node"]) + sum(traffic.get("inter_node_framing_bytes_by_node", [0]))
    payload = sum(tx_bytes) - header_bytes * sum(tx_packets)
    traffic["measured_inter_node_bytes"] = {
        "note": "bytes that left each node over its link (tx) and reached it (rx), headers included; "
                f"payload: tx minus {header_bytes} header bytes per packet; modelled: the meter's inter-node "
                "bytes plus gloo's framing of its messages",
        "total": sum(tx_bytes), "by_node_tx": tx_bytes, "by_node_rx": rx_bytes, "packets": sum(tx_packets),
        "payload": payload, "modelled": modelled,
        "payload_vs_modelled": payload / modelled if modelled else None,
    }


def compression_summary(method: Method, counts: ParameterCounts) -> dict[str, Any]:
    """The paper's compression (of the model being trained; AB: at the end of its last AB phase) and
    the dense : final parameter ratio of the model as the run ends (AB merges back: 1.00)."""
    trained = method.trained_model_counts()
    return {
        "dense_params": counts.dense,
        "final_params": counts.current,
        "dense_over_final_params": counts.compression,
        "trained_model_params": trained.current,
        "trained_model_ratio": trained.compression,
        "trained_model_trainable_ratio": trained.dense / trained.trainable,
        "method_ratio": method.compression_ratio(),
        "ecr_percent": estimated_communication_reduction(trained.compression) if method.compressed_model() else None,
    }


def build_summary(config: RunConfig, state: TrainState, method: Method, topology: Topology,
                  per_rank: list[list[dict[str, Any]]], rank: int, loss_scale: float | None) -> dict[str, Any]:
    """The summary of a run at `state`: `per_rank` is every rank's meter rows (gather_rows), `rank` this
    rank's number, `loss_scale` the gradient scaler's (None without one)."""
    counts = method.parameter_counts()
    element = next(method.model.parameters()).element_size()
    ddp_step_bytes = counts.dense * element * wire_factor(Op.ALL_REDUCE, topology.world_size)
    history = state.history
    final = history[-1] if history else {}
    summary: dict[str, Any] = {
        "name": config.name,
        "method": config.method.name,
        "world_size": topology.world_size,
        "num_nodes": topology.num_nodes,
        "ranks_per_node": topology.ranks_per_node,
        "steps": config.train.steps,
        "steps_done": state.step,
        "strict_device": strict_device.active(),
        "stopped_early": state.stopped_early,
        "final": {k: final.get(k) for k in ("val_top1", "val_top5", "val_loss")},
        "best_top1": max((h["val_top1"] for h in history), default=None),
        "history": history,
        "compression": compression_summary(method, counts),
        "traffic": traffic_summary(per_rank, state.step, state.train_seconds,
                                   topology.node_of_rank, ddp_step_bytes),
        "memory": {"rank": rank, "held_bytes_by_phase": method.held_bytes_by_phase},
        "precision": {"name": config.train.precision, "skipped_steps": state.skipped_steps,
                      "loss_scale": loss_scale},
        "timing": {"train_seconds": state.train_seconds,
                   "seconds_per_step": state.train_seconds / max(1, state.step),
                   "by_phase": {phase: {"steps": int(steps), "seconds": seconds}
                                for phase, (steps, seconds) in state.seconds_by_phase.items()},
                   "phase_starts": [list(start) for start in state.phase_starts],
                   "local_batch_size": config.train.local_batch_size,
                   "target_top1": config.train.target_top1,
                   "time_to_target_seconds": time_to_target(history, config.train.target_top1)},
        "config": flatten(config),
    }
    summary.update(method.summary())
    return summary


def add_cluster_time(summary: dict[str, Any], config: RunConfig, data_info: DatasetInfo, cluster: Cluster | None) -> None:
    """What the cluster time model needs beyond the run's counts (its forward FLOPs a sample), and with
    train.cluster the prediction itself (abtune/timing.py). Rank 0's, for the summary it writes."""
    summary["timing"]["forward_flops_per_sample"] = forward_flops_per_sample(config.model, data_info)
    if cluster is not None:
        summary["predicted"] = predict(summary, cluster).as_dict()


def time_to_target(history: list[dict[str, Any]], target: float | None) -> float | None:
    """Training seconds at the first evaluation whose top-1 reached `target` (None: no target, or never reached)."""
    if target is None:
        return None
    return next((row["train_seconds"] for row in history if row["val_top1"] >= target), None)
