"""What the layers above a method read of its phase schedule: its segments (a phase over a range of
steps) and its description in steps. A leaf: the base settings name this shape, each method's settings
build their own schedule, and neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from abtune.phases import Phase


@dataclass(frozen=True)
class Segment:
    phase: Phase
    start: int
    end: int  # exclusive


class PhaseSchedule(Protocol):
    @property
    def segments(self) -> tuple[Segment, ...]: ...

    def describe(self) -> dict[str, int]:
        """The schedule in steps, as the run summary, the trackers and `promote` record it."""
        ...
