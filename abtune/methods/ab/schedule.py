"""AB-training's phase schedule, turned from fractions into absolute steps once.

warmup (full-rank DDP) | AB | rebound | AB | rebound | ... until the step budget is spent.
A change of shape happens at the start of every AB segment (decompose) and at the end of every
AB segment (sync and rebuild W = A.B); the learning rate rebounds after each, from a floor near zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from abtune.config import AbConfig


class Phase(StrEnum):
    WARMUP = "warmup"
    AB = "ab"
    REBOUND = "rebound"


def round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


@dataclass(frozen=True)
class Segment:
    phase: Phase
    start: int
    end: int  # exclusive


@dataclass(frozen=True)
class ABSchedule:
    total_steps: int
    warmup_steps: int
    ab_steps: int
    rebound_steps: int
    lr_rebound_steps: int
    lr_floor: float
    segments: tuple[Segment, ...]

    @classmethod
    def from_config(cls, config: AbConfig, total_steps: int) -> ABSchedule:
        warmup = min(total_steps, round_half_up(config.warmup_frac * total_steps))
        ab = max(1, round_half_up(config.ab_frac * total_steps))
        rebound = round_half_up(config.rebound_frac * ab)
        lr_rebound = round_half_up(config.lr_rebound_frac * ab)
        return cls(total_steps, warmup, ab, rebound, lr_rebound, config.lr_rebound_floor,
                   _segments(total_steps, warmup, ab, rebound))

    def segment_at(self, step: int) -> Segment:
        for segment in self.segments:
            if segment.start <= step < segment.end:
                return segment
        raise IndexError(f"step {step} outside the schedule of {self.total_steps} steps")

    def phase_at(self, step: int) -> Phase:
        return self.segment_at(step).phase

    def shape_change_steps(self) -> list[int]:
        """Steps before which the parameters change shape: every AB start and every AB end inside the run."""
        changes = []
        for segment in self.segments:
            if segment.phase is Phase.AB:
                changes.append(segment.start)
                if segment.end < self.total_steps:
                    changes.append(segment.end)
        return changes

    def learning_rate(self, step: int, scheduled: float) -> float:
        """`scheduled`, except in the LR rebound after a change of shape: a linear ramp from the floor
        (the first step after the change) up to `scheduled` (reached the step after the rebound ends)."""
        last_change = max((s for s in self.shape_change_steps() if s <= step), default=None)
        if last_change is None or step - last_change >= self.lr_rebound_steps:
            return scheduled
        start = min(self.lr_floor, scheduled)
        return start + (scheduled - start) * (step - last_change) / self.lr_rebound_steps

    def describe(self) -> dict[str, int]:
        return {
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "ab_steps": self.ab_steps,
            "rebound_steps": self.rebound_steps,
            "lr_rebound_steps": self.lr_rebound_steps,
            "ab_cycles": sum(1 for s in self.segments if s.phase is Phase.AB),
        }


def _segments(total: int, warmup: int, ab: int, rebound: int) -> tuple[Segment, ...]:
    segments = [Segment(Phase.WARMUP, 0, warmup)] if warmup else []
    cursor = warmup
    while cursor < total:
        for phase, length in ((Phase.AB, ab), (Phase.REBOUND, rebound)):
            end = min(total, cursor + length)
            if end > cursor:
                segments.append(Segment(phase, cursor, end))
            cursor = end
    return tuple(segments)
