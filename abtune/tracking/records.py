"""Which MLflow metrics a run's records become, in one place: the live hook and the replay from
metrics.jsonl use the same conversion, so a replay fills exactly the gaps an outage left.

Step series (x-axis: the training step; bytes are rank 0's cumulative wire bytes):
    train/loss, train/lr, train/phase (Phase.code), train/step_seconds, train/skipped_steps (fp16),
    traffic/total_bytes, traffic/inter_node_bytes, traffic/intra_node_bytes (every phase),
    traffic/training_inter_node_gb_per_s (training phases' inter-node bytes per training second),
    traffic/bytes_<phase>, traffic/inter_node_bytes_<phase>,
    val/top1, val/top5, val/loss, model/compression (of the model being trained; AB: its latest AB phase's),
    model/dense_over_current (dense : current parameters), model/trainable_params,
    ab/compression, ab/trainable_compression, ab/params, ab/trainable_params, ab/svd_seconds,
    ab/factored_weights, ab/eligible_weights and per weight ab/rank/<w>, ab/max_rank/<w>, ab/factored/<w>,
    ab/factors_from_cutoff/<w> (at each decomposition).
Final metrics (from summary.json, mean over ranks, at the last step): see `summary_metrics`.
Headline metrics (`HEADLINE`, at step 0, MLflow's step for a value without a history): the run's result
in the units a person reads, to two decimals, under a section name that the MLflow UI lists before every
other (it orders sections by name, capitals first, and each section's charts by key; a value at step 0
is drawn as a bar with its number on it): top-1 in percent, training inter-node MB per rank, the trained
model's compression, the traffic saved against DDP. They repeat `final_top1`, `training_inter_node_bytes`,
`compression` and `reduction_vs_ddp`, which stay as they were for whatever reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from abtune.phases import TRAINING_PHASES, code_of

GIGA = 1e9
HEADLINE_SECTION = "Results"
# At most 15 characters: what the runs table's default column shows whole (it cut "Results/top-1 p...").
# What each means in full: docs/mlflow.md and every run's description.
TOP1_PERCENT = f"{HEADLINE_SECTION}/top-1"  # final top-1, in percent (MLflow refuses "%" in a name)
INTER_NODE_MB = f"{HEADLINE_SECTION}/MB sent"  # training inter-node MB per rank
COMPRESSION_RATIO = f"{HEADLINE_SECTION}/compr."  # the trained model's compression, N:1
VERSUS_DDP = f"{HEADLINE_SECTION}/vs DDP"  # DDP's training traffic over the run's: N times less
HEADLINE = (TOP1_PERCENT, INTER_NODE_MB, COMPRESSION_RATIO, VERSUS_DDP)
HEADLINE_DIGITS = 2  # what a person reads; the exact values are in final_top1, training_inter_node_bytes,
# compression and reduction_vs_ddp


@dataclass(frozen=True)
class Point:
    key: str
    value: float
    step: int


def _points(step: int, values: dict[str, Any]) -> list[Point]:
    """Skip what MLflow cannot hold (None, inf, NaN)."""
    return [Point(key, float(v), step) for key, v in values.items()
            if isinstance(v, int | float) and math.isfinite(v)]


class MetricStream:
    """Converts records in order; keeps the training seconds so far for the GB/s curve."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.last_step = 0

    def log_points(self, record: dict[str, Any]) -> list[Point]:
        step = int(record["step"])
        self.seconds += record["step_seconds"] * max(0, step - self.last_step)
        self.last_step = step
        phase_inter = record.get("phase_inter_node_bytes", {})
        training_inter = sum(v for p, v in phase_inter.items() if p in TRAINING_PHASES)
        values = {
            "train/loss": record["loss"], "train/lr": record["lr"], "train/skipped_steps": record.get("skipped_steps", 0),
            "train/phase": code_of(record["phase"]), "train/step_seconds": record["step_seconds"],
            "traffic/total_bytes": record["total_bytes"],
            "traffic/inter_node_bytes": record["inter_node_bytes"],
            "traffic/intra_node_bytes": record["intra_node_bytes"],
            "traffic/training_inter_node_gb_per_s": training_inter / GIGA / self.seconds if self.seconds else 0.0,
        }
        values.update({f"traffic/bytes_{p}": v for p, v in record.get("phase_bytes", {}).items()})
        values.update({f"traffic/inter_node_bytes_{p}": v for p, v in record.get("phase_inter_node_bytes", {}).items()})
        return _points(step, values)

    @staticmethod
    def evaluation_points(row: dict[str, Any]) -> list[Point]:
        return _points(int(row["step"]), {
            "val/top1": row.get("val_top1"), "val/top5": row.get("val_top5"), "val/loss": row.get("val_loss"),
            "model/compression": row.get("model_compression"), "model/dense_over_current": row.get("dense_over_current"),
            "model/trainable_params": row.get("trainable_params"),
            "traffic/predicted_training_inter_node_bytes": row.get("predicted_training_inter_node_bytes"),
        })

    def record_points(self, record: dict[str, Any]) -> list[Point]:
        """One line of metrics.jsonl (`kind` log or evaluation; the summary line is read from summary.json)."""
        if record.get("kind") == "log":
            return self.log_points(record)
        if record.get("kind") == "evaluation":
            return self.evaluation_points(record)
        return []


def records_points(records: list[dict[str, Any]]) -> list[Point]:
    stream = MetricStream()
    return [point for record in records for point in stream.record_points(record)]


def decomposition_points(summary: dict[str, Any]) -> list[Point]:
    return [point for d in summary.get("decompositions", []) for point in _points(int(d["step"]), {
        "ab/compression": d["compression"], "ab/trainable_compression": d.get("trainable_compression"),
        "ab/params": d["params"], "ab/trainable_params": d["trainable"],
        "ab/svd_seconds": d["svd_seconds"], **_weight_values(d.get("weights", {})),
    })]


def _weight_values(weights: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per weight: the rank the cutoff chose, the cap's largest factored rank, whether it was factored and the
    cutoff from which it would be (absent: no cutoff would)."""
    values: dict[str, Any] = {"ab/factored_weights": sum(w["factored"] for w in weights.values()),
                              "ab/eligible_weights": len(weights)} if weights else {}
    for key, w in weights.items():
        values.update({f"ab/rank/{key}": w["rank"], f"ab/max_rank/{key}": w["max_rank"],
                       f"ab/factored/{key}": int(w["factored"]), f"ab/factors_from_cutoff/{key}": w["factors_from_cutoff"]})
    return values


def summary_metrics(summary: dict[str, Any], wall_seconds: float | None) -> dict[str, float | None]:
    """The run's result: top-1, traffic (per rank, mean over ranks, as in summary.json), compression, time."""
    traffic, final, compression = summary["traffic"], summary["final"], summary["compression"]
    values: dict[str, float | None] = {
        "best_top1": summary["best_top1"], "final_top1": final["val_top1"], "final_top5": final["val_top5"],
        "final_val_loss": final["val_loss"],
        "total_bytes": traffic["total_bytes"]["mean"], "inter_node_bytes": traffic["inter_node_bytes"]["mean"],
        "intra_node_bytes": traffic["intra_node_bytes"]["mean"], "training_bytes": traffic["training_bytes"],
        "training_inter_node_bytes": traffic["training_inter_node_bytes"],
        "ddp_reference_bytes": traffic["ddp_reference_bytes"], "reduction_vs_ddp": traffic["reduction_vs_ddp"],
        "inter_node_reduction_vs_ddp": traffic.get("inter_node_reduction_vs_ddp"),
        "training_inter_node_gb_per_s": traffic["training_inter_node_gb_per_s"],
        "compression": compression["trained_model_ratio"],
        "trainable_compression": compression["trained_model_trainable_ratio"],
        "dense_over_final_params": compression["dense_over_final_params"], "ecr_percent": compression["ecr_percent"],
        "train_seconds": summary["timing"]["train_seconds"], "seconds_per_step": summary["timing"]["seconds_per_step"],
        "time_to_target_seconds": summary["timing"].get("time_to_target_seconds"),
        "wall_seconds": wall_seconds,
    }
    for phase, by in traffic["by_phase"].items():
        values[f"bytes_{phase}"] = by["total"]["mean"]
        values[f"inter_node_bytes_{phase}"] = by["inter"]["mean"]
    for phase, held in summary.get("memory", {}).get("held_bytes_by_phase", {}).items():
        values[f"held_bytes_{phase}"] = held["total"]  # rank 0's parameters, gradients and optimizer state
    if "inter_node_messages" in traffic:
        values["inter_node_messages"] = traffic["inter_node_messages"]["mean"]
    return {**values, **measured_metrics(traffic), **predicted_metrics(summary.get("predicted"))}


def predicted_metrics(predicted: dict[str, Any] | None) -> dict[str, float | None]:
    """With train.cluster: the run's predicted time on that cluster (abtune/timing.py); inf becomes None."""
    if predicted is None:
        return {}
    finite = lambda value: None if value is None or value == float("inf") else value  # noqa: E731
    return {"predicted/train_seconds": predicted["train_seconds"],
            "predicted/time_to_target_seconds": finite(predicted["time_to_target_seconds"]),
            "predicted/sync_seconds": predicted["sync_seconds"],
            "predicted/step_floor_seconds": predicted.get("step_floor_seconds"),
            **{f"predicted/step_seconds_{phase}": s for phase, s in predicted["step_seconds"].items()}}


def predicted_tags(predicted: dict[str, Any] | None) -> dict[str, str]:
    """Where the predicted figures' compute comes from, as tags (metrics hold numbers only); absent before
    predictions carried it."""
    if predicted is None or "compute_source" not in predicted:
        return {}
    return {"abtune.predicted.compute_source": predicted["compute_source"],
            "abtune.predicted.compute_source_detail": predicted["compute_source_detail"],
            "abtune.predicted.cluster": predicted["cluster"]}


def measured_metrics(traffic: dict[str, Any]) -> dict[str, float | None]:
    """On the emulated interconnect: the bytes the links carried (all nodes, and each node's way out),
    beside the model's figure for the same bytes (all ranks)."""
    measured = traffic.get("measured_inter_node_bytes")
    if measured is None:
        return {}
    return {"traffic/measured_inter_node_bytes": measured["total"],
            "traffic/measured_inter_node_payload_bytes": measured["payload"],
            "traffic/modelled_inter_node_bytes": measured["modelled"],
            **{f"traffic/measured_inter_node_bytes_node{n}": tx for n, tx in enumerate(measured["by_node_tx"])}}


def headline_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    """The result in the units a person reads, rounded as a person reads it (see the module)."""
    top1 = summary["final"]["val_top1"]
    versus_ddp = summary["traffic"]["reduction_vs_ddp"]
    values = {TOP1_PERCENT: None if top1 is None else 100.0 * top1,
              INTER_NODE_MB: summary["traffic"]["training_inter_node_bytes"] / 1e6,
              COMPRESSION_RATIO: summary["compression"]["trained_model_ratio"],
              VERSUS_DDP: versus_ddp if math.isfinite(versus_ddp) else None}
    return {key: None if v is None else round(v, HEADLINE_DIGITS) for key, v in values.items()}


def final_points(summary: dict[str, Any], wall_seconds: float | None) -> list[Point]:
    return (decomposition_points(summary) + _points(int(summary["steps_done"]), summary_metrics(summary, wall_seconds))
            + _points(0, headline_metrics(summary)))


def run_description(summary: dict[str, Any], what: str) -> str:
    """The run's result in one line of markdown, for the top of its MLflow page (`what`: e.g. `trial 7 of
    study quickstart`)."""
    traffic, compression = summary["traffic"], summary["compression"]
    top1 = summary["final"]["val_top1"]
    inter = traffic["training_inter_node_bytes"] / 1e6
    ddp = traffic.get("ddp_reference_inter_node_bytes")
    versus = f" ({inter / (ddp / 1e6):.2f}x DDP's {ddp / 1e6:,.2f} MB)" if ddp else ""
    shown_top1 = "-" if top1 is None else f"{top1:.4f}"
    return (f"**{what}** ({summary['method']}, {summary['steps_done']} steps): top-1 **{shown_top1}**, training "
            f"inter-node traffic **{inter:,.2f} MB** per rank{versus}, trained-model compression "
            f"**{compression['trained_model_ratio']:.2f}:1**")
