"""The run summary: accuracy, compression, traffic (per phase, group, intra/inter node), timing.

Traffic is per rank; ranks differ (an A group all-reduces A's gradients, a B group B's), so every
rank's counters are gathered (one metered all-gather) and the summary gives their mean and max.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from abtune.comm import TRAINING_PHASES, Op, all_gather_bytes, sum_rows, wire_factor
from abtune.config import flatten
from abtune.methods.base import ParameterCounts

if TYPE_CHECKING:
    from abtune.training.trainer import Trainer

GIGA = 1e9
# Equation 4 of the AB paper as its Table 2 reads it: near full rank for 25% of training (F), at the
# final compression for the other 75% (L); c = 1 / compression ratio.
ECR_FULL_RANK_SHARE, ECR_COMPRESSED_SHARE = 0.25, 0.75


def gather_rows(trainer: Trainer) -> list[list[dict[str, Any]]]:
    """Every rank's meter rows, via a metered all-gather of their JSON."""
    trainer.meter.phase = "report"
    mine = json.dumps(trainer.meter.rows()).encode()
    blobs = all_gather_bytes(trainer.meter, mine, trainer.world, trainer.env.device)
    return [json.loads(blob) for blob in blobs]


def estimated_communication_reduction(ratio: float, full_rank_share: float = ECR_FULL_RANK_SHARE,
                                      compressed_share: float = ECR_COMPRESSED_SHARE) -> float:
    """ECR = 100% - F - L c (equation 4), in percent, for a model compressed `ratio`:1."""
    return 100.0 * (1.0 - full_rank_share - compressed_share / ratio)


def traffic_summary(per_rank: list[list[dict[str, Any]]], steps: int, seconds: float, multi_node: bool,
                    ddp_step_bytes: float) -> dict[str, Any]:
    def stats(**match: str) -> dict[str, float]:
        values = [sum_rows(rows, **match) for rows in per_rank]
        return {"mean": sum(values) / len(values), "max": max(values)}

    phases = sorted({r["phase"] for rows in per_rank for r in rows})
    training_bytes = sum(stats(phase=p)["mean"] for p in phases if p in TRAINING_PHASES)
    inter_training = sum(stats(phase=p, locality="inter")["mean"] for p in phases if p in TRAINING_PHASES)
    other = [p for p in phases if p not in TRAINING_PHASES]
    ddp_reference = steps * ddp_step_bytes
    return {
        "note": "wire bytes sent per rank (ring estimates); mean and max over ranks. total_bytes, inter_node_bytes "
                "and intra_node_bytes count every phase; training_* count the training phases only "
                f"({', '.join(TRAINING_PHASES)}), non_training_* the others; GB/s is training bytes per training second",
        "total_bytes": stats(),
        "inter_node_bytes": stats(locality="inter"),
        "intra_node_bytes": stats(locality="intra"),
        "by_phase": {p: {"total": stats(phase=p), "inter": stats(phase=p, locality="inter")} for p in phases},
        "per_step_bytes": training_bytes / max(1, steps),
        "training_inter_node_gb_per_s": inter_training / GIGA / seconds if seconds else 0.0,
        "ddp_reference_bytes": ddp_reference,
        "ddp_reference_inter_node_bytes": ddp_reference if multi_node else 0.0,
        "training_bytes": training_bytes,
        "training_inter_node_bytes": inter_training,
        "non_training_bytes": {p: stats(phase=p)["mean"] for p in other},
        "non_training_inter_node_bytes": {p: stats(phase=p, locality="inter")["mean"] for p in other},
        "reduction_vs_ddp": ddp_reference / training_bytes if training_bytes else float("inf"),
        "inter_node_reduction_vs_ddp": (ddp_reference / inter_training if inter_training else float("inf"))
        if multi_node else None,
        "rows_per_rank": per_rank,
    }


def compression_summary(method: Any, counts: ParameterCounts) -> dict[str, Any]:
    """The paper's compression (of the model being trained; AB: at the end of its last AB phase) and
    the dense : final parameter ratio of the model as the run ends (AB merges back: 1.00)."""
    trained = method.trained_model_counts()
    compresses_model = bool(getattr(method, "decompositions", None))
    return {
        "dense_params": counts.dense,
        "final_params": counts.current,
        "dense_over_final_params": counts.compression,
        "trained_model_params": trained.current,
        "trained_model_ratio": trained.compression,
        "trained_model_trainable_ratio": trained.dense / trained.trainable,
        "method_ratio": method.compression_ratio(),
        "ecr_percent": estimated_communication_reduction(trained.compression) if compresses_model else None,
    }


def build_summary(trainer: Trainer) -> dict[str, Any]:
    per_rank = gather_rows(trainer)
    method, topology, config = trainer.method, trainer.topology, trainer.config
    counts = method.parameter_counts()
    element = next(method.model.parameters()).element_size()
    ddp_step_bytes = counts.dense * element * wire_factor(Op.ALL_REDUCE, topology.world_size)
    history = trainer.state.history
    final = history[-1] if history else {}
    summary: dict[str, Any] = {
        "name": config.name,
        "method": config.method.name,
        "world_size": topology.world_size,
        "num_nodes": topology.num_nodes,
        "ranks_per_node": topology.ranks_per_node,
        "steps": config.train.steps,
        "steps_done": trainer.state.step,
        "stopped_early": trainer.state.stopped_early,
        "final": {k: final.get(k) for k in ("val_top1", "val_top5", "val_loss")},
        "best_top1": max((h["val_top1"] for h in history), default=None),
        "history": history,
        "compression": compression_summary(method, counts),
        "traffic": traffic_summary(per_rank, trainer.state.step, trainer.state.train_seconds,
                                   topology.num_nodes > 1, ddp_step_bytes),
        "timing": {"train_seconds": trainer.state.train_seconds,
                   "seconds_per_step": trainer.state.train_seconds / max(1, trainer.state.step)},
        "config": flatten(config),
    }
    summary.update(_method_details(method))
    summary.update(method.summary())
    return summary


def _method_details(method: Any) -> dict[str, Any]:
    details: dict[str, Any] = {}
    schedule = getattr(method, "schedule", None)
    if schedule is not None:
        details["schedule"] = schedule.describe()
    groups = getattr(method, "groups", None)
    if groups is not None:
        details["groups"] = {"group_size": groups.group_size, "num_groups": groups.num_groups,
                             "a_ranks": list(groups.a_ranks), "b_ranks": list(groups.b_ranks)}
    decompositions = getattr(method, "decompositions", None)
    if decompositions is not None:
        details["decompositions"] = decompositions
        details["compression_during_ab"] = [d["compression"] for d in decompositions]
        details["svd_seconds"] = [d["svd_seconds"] for d in decompositions]
        details["spectra"] = getattr(method, "spectra", {})
    return details
