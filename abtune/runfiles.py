"""The run folder's contract: the names of the files a run leaves, and a typed reader of its summary.

Every module that writes or reads a run folder takes the names from here, so a file is renamed in
one place. summary.json is written by the trainer (`abtune.training.summary` builds it) and read by
the CLI, the study, tracking, compare and promote; `RunSummary` names the fields they read, and
`.raw` keeps the whole document for the rest (plots, tracking's metrics).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtune.errors import ConfigError

CONFIG_FILE = "config.yaml"  # the resolved run config every rank reads
SUMMARY_FILE = "summary.json"  # what a finished run measured
METRICS_FILE = "metrics.jsonl"  # one JSON record per log, evaluation and the end
HOOKS_FILE = "hooks.yaml"  # the training hooks the launcher hands the ranks
FAILURES_DIR = "failures"  # one file per failed rank, cleared when the run starts again
OUTCOME_FILE = "outcome.json"  # how a launch ended (launch.outcome)
CHECKPOINTS_DIR = "checkpoints"  # one step_NNNNNNNN folder per checkpoint ...
COMPLETE_MARK = "COMPLETE"  # ... complete once this file is in it (written last)
CHECKPOINT_LAYOUT = "layout.json"  # ... beside the nodes x ranks per node that wrote it
RANK_FILES = "rank_*.pt"  # ... and one file per rank


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoint folders, oldest first (their names are zero-padded step numbers)."""
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / COMPLETE_MARK).exists())


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's newest complete checkpoint, the one `--resume` continues from; None without one."""
    complete = complete_checkpoints(run_dir)
    return int(complete[-1].name.removeprefix("step_")) if complete else None


def write_checkpoint_layout(folder: Path, nodes: int, ranks_per_node: int) -> None:
    (folder / CHECKPOINT_LAYOUT).write_text(json.dumps({"nodes": nodes, "ranks_per_node": ranks_per_node}))


def check_checkpoint_layout(run_dir: Path, nodes: int, ranks_per_node: int) -> None:
    """`--resume` continues on the layout that wrote the newest checkpoint, else one ConfigError naming both.

    A checkpoint holds one file per rank, and the layout decides AB's groups (which ranks hold which factors),
    the data each rank reads and each rank's optimizer state: on another layout a run fails on the optimizer's
    parameters, or, worse, goes on with other groups than it began with. A checkpoint written before layouts
    were recorded is checked on its number of rank files."""
    complete = complete_checkpoints(run_dir)
    if not complete:
        return
    folder = complete[-1]
    recorded = folder / CHECKPOINT_LAYOUT
    now = _layout_words(nodes, ranks_per_node)
    if recorded.exists():
        then = json.loads(recorded.read_text())
        if (then["nodes"], then["ranks_per_node"]) == (nodes, ranks_per_node):
            return
        was, flags = _layout_words(then["nodes"], then["ranks_per_node"]), (
            f"--nproc {then['nodes'] * then['ranks_per_node']} --ranks-per-node {then['ranks_per_node']}")
    else:
        ranks = len(list(folder.glob(RANK_FILES)))
        if ranks == nodes * ranks_per_node:
            return
        was, flags = f"{ranks} ranks", f"--nproc {ranks}"
    raise ConfigError(f"--resume: the checkpoint at step {folder.name.removeprefix('step_')} was written by {was}, "
                      f"this launch has {now}; a run resumes on its own layout (AB's groups, the data and the "
                      f"optimizer state of each rank follow it): resume with {flags} (nodes and tasks_per_node in "
                      "a launcher profile), or start a new --run-dir")


def _layout_words(nodes: int, ranks_per_node: int) -> str:
    return f"{nodes} node(s) x {ranks_per_node} rank(s) (world size {nodes * ranks_per_node})"


def summary_path(run_dir: Path) -> Path:
    return run_dir / SUMMARY_FILE


def write_summary(run_dir: Path, raw: dict[str, Any]) -> None:
    summary_path(run_dir).write_text(json.dumps(raw, indent=2))


def read_summary(run_dir: Path) -> RunSummary:
    """The summary of a finished run; a ConfigError naming the folder when the run left none."""
    path = summary_path(run_dir)
    if not path.is_file():
        raise ConfigError(f"{run_dir} holds no {SUMMARY_FILE}: the run has not finished (or failed)")
    return RunSummary(json.loads(path.read_text()))


def find_summary(run_dir: Path) -> RunSummary | None:
    """The summary when the run finished, else None."""
    return read_summary(run_dir) if summary_path(run_dir).is_file() else None


@dataclass(frozen=True)
class RunSummary:
    """summary.json, typed where it is read. Traffic figures are wire bytes per rank, mean over ranks."""

    raw: dict[str, Any]

    # --- the run ---
    @property
    def name(self) -> str:
        return str(self.raw["name"])

    @property
    def method(self) -> str:
        return str(self.raw["method"])

    @property
    def world_size(self) -> int:
        return int(self.raw["world_size"])

    @property
    def num_nodes(self) -> int:
        return int(self.raw["num_nodes"])

    @property
    def steps_done(self) -> int:
        return int(self.raw["steps_done"])

    @property
    def stopped_early(self) -> str | None:
        """Why the run stopped before its last step (a pruner, a stop request); None: it ran every step."""
        return self.raw["stopped_early"]

    # --- accuracy ---
    @property
    def final(self) -> dict[str, float | None]:
        """The last evaluation: val_top1, val_top5, val_loss."""
        return dict(self.raw["final"])

    @property
    def final_top1(self) -> float | None:
        return self.raw["final"]["val_top1"]

    @property
    def final_loss(self) -> float | None:
        return self.raw["final"]["val_loss"]

    @property
    def best_top1(self) -> float | None:
        return self.raw["best_top1"]

    @property
    def validation_images(self) -> int | None:
        """Images the last evaluation scored: one of them is 1 / this of top-1."""
        history = self.raw.get("history") or []
        return int(history[-1]["val_samples"]) if history and history[-1].get("val_samples") else None

    # --- compression ---
    @property
    def compression(self) -> float:
        """The compression of the model being trained as the AB paper reports it (x in x:1)."""
        return float(self.raw["compression"]["trained_model_ratio"])

    @property
    def trainable_compression(self) -> float:
        """Dense parameters per trainable parameter of the model being trained (AB trains one factor at a time)."""
        return float(self.raw["compression"]["trained_model_trainable_ratio"])

    @property
    def dense_over_final_params(self) -> float:
        """Dense parameters per parameter of the model as the run ends (AB merges back: 1.00)."""
        return float(self.raw["compression"]["dense_over_final_params"])

    @property
    def method_ratio(self) -> float:
        """The method's own compression figure (AB's parameters, SBC's and PowerSGD's updates, fp16's 2:1)."""
        return float(self.raw["compression"]["method_ratio"])

    @property
    def ecr_percent(self) -> float | None:
        """Equation 4's estimated communication reduction; None for methods that do not compress the model."""
        return self.raw["compression"]["ecr_percent"]

    # --- traffic ---
    @property
    def traffic(self) -> dict[str, Any]:
        return dict(self.raw["traffic"])

    @property
    def training_bytes(self) -> float:
        return float(self.raw["traffic"]["training_bytes"])

    @property
    def training_inter_node_bytes(self) -> float:
        return float(self.raw["traffic"]["training_inter_node_bytes"])

    @property
    def training_inter_node_gb_per_s(self) -> float:
        return float(self.raw["traffic"]["training_inter_node_gb_per_s"])

    @property
    def non_training_bytes(self) -> float:
        return float(sum(self.raw["traffic"]["non_training_bytes"].values()))

    @property
    def reduction_vs_ddp(self) -> float:
        return float(self.raw["traffic"]["reduction_vs_ddp"])

    @property
    def inter_node_reduction_vs_ddp(self) -> float | None:
        """None on one node: DDP would send nothing between nodes either."""
        return self.raw["traffic"].get("inter_node_reduction_vs_ddp")

    @property
    def ddp_reference_bytes(self) -> float:
        return float(self.raw["traffic"]["ddp_reference_bytes"])

    @property
    def ddp_reference_inter_node_bytes(self) -> float:
        return float(self.raw["traffic"]["ddp_reference_inter_node_bytes"])

    @property
    def measured_inter_node_bytes(self) -> dict[str, Any] | None:
        """What the emulated interconnect's links carried; None off a fabric."""
        return self.raw["traffic"].get("measured_inter_node_bytes")

    # --- timing ---
    @property
    def train_seconds(self) -> float:
        return float(self.raw["timing"]["train_seconds"])

    @property
    def seconds_per_step(self) -> float:
        return float(self.raw["timing"]["seconds_per_step"])

    @property
    def target_top1(self) -> float | None:
        return self.raw["timing"].get("target_top1")

    @property
    def time_to_target_seconds(self) -> float | None:
        """Training seconds until the first evaluation at train.target_top1; None: no target, or never reached."""
        return self.raw["timing"].get("time_to_target_seconds")

    @property
    def held_bytes_by_phase(self) -> dict[str, dict[str, int]]:
        """Per phase, the bytes of parameters, gradients and optimizer state rank 0 held (`total` their sum);
        empty for runs from before it was counted."""
        return dict(self.raw.get("memory", {}).get("held_bytes_by_phase", {}))

    # --- AB's decompositions ---
    @property
    def schedule(self) -> dict[str, Any] | None:
        """AB's phases in steps (warmup, AB and rebound lengths, number of cycles); None for other methods."""
        return self.raw.get("schedule")

    @property
    def decompositions(self) -> list[dict[str, Any]]:
        """AB's decompositions in order: step, ranks, compression and, per eligible weight, `weights[key]` =
        {rank, max_rank, factored, factors_from_cutoff} (see `lowrank.WeightDecomposition`)."""
        return list(self.raw.get("decompositions", []))

    @property
    def first_decomposition_ranks(self) -> dict[str, int] | None:
        """The rank of every weight factored at the first decomposition; None when AB never decomposed."""
        first = self.raw.get("decompositions") or [None]
        return None if first[0] is None else dict(first[0]["ranks"])
