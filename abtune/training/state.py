"""Where a run stands: the trainer advances it, checkpoints save it, the summary reads it. A leaf of
training/, so the summary takes it (and its other inputs) explicitly and never imports the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_seconds: float = 0.0
    # {phase: [steps, seconds]}: the run's compute profile for the cluster time model (abtune/timing.py)
    seconds_by_phase: dict[str, list[float]] = field(default_factory=dict)
    phase_starts: list[tuple[str, int]] = field(default_factory=list)  # (phase, first step) at each change
    skipped_steps: int = 0  # fp16: steps the gradient scaler skipped (overflow)
    stopped_early: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
