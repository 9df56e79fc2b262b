"""The base learning-rate schedule (a method's rebound factor multiplies it)."""

from __future__ import annotations

import math

from abtune.config import ScheduleConfig


def scheduled_lr(config: ScheduleConfig, base_lr: float, step: int, total_steps: int) -> float:
    warmup = int(config.warmup_frac * total_steps)
    if step < warmup:
        return base_lr * (step + 1) / (warmup + 1)
    if config.name == "constant":
        return base_lr
    progress = (step - warmup) / max(1, total_steps - warmup)
    floor = config.min_lr_frac * base_lr
    return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
