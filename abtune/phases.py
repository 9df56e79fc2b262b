"""Every phase a run's traffic and time are counted in: one list, with what each reader asks of a phase.

A method names the phase it is in (`meter.phase = Phase.EVAL`); the summary and the trainer split
training traffic from the rest by `training`, the time model (abtune/timing.py) overlaps the
gradient all-reduces of `overlapped` phases with the backward pass, and the trackers record `code`
as the `train/phase` metric and shade plots with `colour`, listing phases in this order (the order
a run meets them: set-up, the training phases, then what runs beside them). A method that adds a
phase adds one line here. A leaf module: every layer reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

UNKNOWN_CODE = -1  # the `train/phase` value of a phase no step runs in (or one this version does not know)
UNSHADED = "0.9"  # the colour of a phase without one of its own


class Phase(StrEnum):
    training: bool  # its collectives are training itself (gradients, updates, AB's factors and sync)
    overlapped: bool  # DDP's gradient all-reduces run in it, beside the backward pass; else they block
    code: int  # its `train/phase` metric value
    colour: str  # its shading in plots over steps

    def __new__(cls, value: str, training: bool, overlapped: bool, code: int, colour: str) -> Phase:
        member = str.__new__(cls, value)
        member._value_ = value
        member.training, member.overlapped, member.code, member.colour = training, overlapped, code, colour
        return member

    SETUP = "setup", False, False, UNKNOWN_CODE, UNSHADED
    TRAIN = "train", True, True, 0, "0.95"  # a method of one phase (DDP, SBC, PowerSGD, fp16)
    WARMUP = "warmup", True, True, 1, "0.85"  # AB: full-rank steps before the first AB phase
    AB = "ab", True, True, 2, "tab:orange"  # AB: the groups train A or B
    SYNC = "sync", True, False, UNKNOWN_CODE, UNSHADED  # AB: the factors averaged as an AB phase ends
    REBOUND = "rebound", True, True, 3, "tab:cyan"  # AB: full-rank steps after a sync
    EVAL = "eval", False, False, UNKNOWN_CODE, UNSHADED
    CHECKPOINT = "checkpoint", False, False, UNKNOWN_CODE, UNSHADED
    CONTROL = "control", False, False, UNKNOWN_CODE, UNSHADED  # the ranks agreeing to stop early or go on
    REPORT = "report", False, False, UNKNOWN_CODE, UNSHADED  # gathering every rank's counts for the summary


_NAMES = frozenset(phase.value for phase in Phase)
TRAINING_PHASES = tuple(phase for phase in Phase if phase.training)
"""Phases whose collectives are training itself: the traffic studies optimize and DDP's training
reference is set against. The others (set-up, evaluation, checkpoint, control, report) are counted apart."""


def code_of(name: str) -> int:
    """The `train/phase` metric value of a phase by name; UNKNOWN_CODE for one this version does not know."""
    return Phase(name).code if name in _NAMES else UNKNOWN_CODE


def colour_of(name: str) -> str:
    return Phase(name).colour if name in _NAMES else UNSHADED


def in_order(names: Iterable[str]) -> list[str]:
    """Phases as a run meets them; names this version does not know (an older run's) after, sorted."""
    names = set(names)
    return [p.value for p in Phase if p in names] + sorted(n for n in names if n not in _NAMES)
