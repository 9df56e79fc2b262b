"""Checkpoints: one folder per step, one file per rank (ranks hold different factors during AB).

A folder counts only once every rank has written its file and rank 0 has written COMPLETE, so a
run killed while saving resumes from the previous complete folder. The newest `keep` folders stay.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from abtune.comm import CommGroup, CommMeter
from abtune.errors import TrainingFailed
from abtune.phases import Phase
from abtune.runfiles import CHECKPOINTS_DIR, COMPLETE_MARK, complete_checkpoints, write_checkpoint_layout

STEP_DIGITS = 8


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, run_dir: Path, rank: int, keep: int, meter: CommMeter, world: CommGroup,
                 layout: tuple[int, int]) -> None:
        self.root = run_dir / CHECKPOINTS_DIR
        self.rank = rank
        self.layout = layout  # nodes, ranks per node: what `--resume` must run on
        self.keep = keep
        self.meter = meter
        self.world = world

    def folder(self, step: int) -> Path:
        return self.root / f"step_{step:0{STEP_DIGITS}d}"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        folder = self.folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"rank_{self.rank}.pt"
        partial = target.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, target)
        self.meter.phase = Phase.CHECKPOINT
        self.meter.barrier(self.world)  # every rank's file is on disk
        if self.rank == 0:
            write_checkpoint_layout(folder, *self.layout)
            (folder / COMPLETE_MARK).touch()
            self._prune()
        self.meter.barrier(self.world)  # nobody starts the next save before the marker exists
        return folder

    def _prune(self) -> None:
        for old in self.complete_folders()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def complete_folders(self) -> list[Path]:
        return complete_checkpoints(self.root.parent)

    def latest(self) -> Path | None:
        folders = self.complete_folders()
        return folders[-1] if folders else None

    def load(self, folder: Path) -> dict[str, Any]:
        return torch.load(folder / f"rank_{self.rank}.pt", map_location="cpu", weights_only=False)


def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name instead of by position.

    A method rebuilds parameters as the model changes shape (factors appear, merged weights are
    re-registered), so positions differ between a running model and a freshly built one restored
    from a checkpoint; names do not.
    """
    saved = optimizer.state_dict()
    by_index = dict(zip(_indices(saved), _names(model, optimizer), strict=True))
    return {
        "state": {by_index[i]: s for i, s in saved["state"].items()},
        "param_groups": [{**g, "params": [by_index[i] for i in g["params"]]} for g in saved["param_groups"]],
    }


def load_optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                 saved: dict[str, Any]) -> None:
    current = optimizer.state_dict()
    names = _names(model, optimizer)
    saved_names = [n for g in saved["param_groups"] for n in g["params"]]
    if sorted(saved_names) != sorted(names):
        missing = sorted(set(names) ^ set(saved_names))
        raise TrainingFailed(f"the checkpoint's optimizer holds other parameters than the model ({', '.join(missing[:3])}...)")
    by_name = dict(zip(names, _indices(current), strict=True))
    optimizer.load_state_dict({
        "state": {by_name[n]: s for n, s in saved["state"].items()},
        "param_groups": [{**g, "params": c["params"]}
                         for g, c in zip(saved["param_groups"], current["param_groups"], strict=True)],
    })


def _indices(state_dict: dict[str, Any]) -> list[int]:
    return [i for group in state_dict["param_groups"] for i in group["params"]]


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameters, in the optimizer's order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
