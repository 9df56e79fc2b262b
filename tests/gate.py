"""A training hook that holds rank 0 at one logged step until the test says go: a run stays mid-training for
as long as a test needs (a stop, a kill, a requeue), without training thousands of steps to outlast it.

Rank 0 touches RUN_DIR/NAME.paused on reaching the step and waits there for RUN_DIR/NAME.go (300 s at the
most, a safety net). Its peers wait in their next collective meanwhile. A run resumed from a checkpoint
before the step meets the gate again. Kept free of heavy imports: every rank 0 that runs it imports this.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from abtune.training.hooks import TrainingHook, hook_spec

HOLD_S = 300


class Gate(TrainingHook):
    def __init__(self, run_dir: Path, step: int, name: str = "gate") -> None:
        self.run_dir, self.step, self.name = Path(run_dir), step, name

    def on_log(self, record: dict[str, Any]) -> None:
        if record["step"] != self.step:
            return
        (self.run_dir / f"{self.name}.paused").touch()
        deadline = time.monotonic() + HOLD_S
        while not (self.run_dir / f"{self.name}.go").exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def gate(run_dir: Path, step: int, name: str = "gate") -> Gate:
    return Gate(run_dir, step, name)


def gate_spec(step: int, name: str = "gate") -> dict[str, Any]:
    """The hooks.yaml entry (or study `hooks:` entry) of a gate at `step`; it never stops the run."""
    return {**hook_spec(gate, step=step, name=name), "may_stop": False}


def paused(run_dir: Path, name: str = "gate") -> bool:
    return (run_dir / f"{name}.paused").exists()


def release(run_dir: Path, name: str = "gate") -> None:
    (run_dir / f"{name}.go").touch()
