"""The settings of `method: ab` and `ab-nogroups` (abtune/methods/ab/method.py), and AB's phase schedule.

warmup (full-rank DDP) | AB | rebound | AB | rebound | ... until the step budget is spent, turned
from the settings' fractions into absolute steps once (ABSchedule). A change of shape happens at the
start of every AB segment (decompose) and at the end of every AB segment (sync and rebuild W = A.B);
the learning rate rebounds after each, from a floor near zero. Torch-free: the study, promote and
the trackers read the schedule without importing the method."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from abtune.errors import ConfigError
from abtune.methods.schedule import Segment
from abtune.methods.settings import MethodSettings
from abtune.phases import Phase
from abtune.schema import Fraction


class AbConfig(MethodSettings):
    """AB-training. Step counts are fractions so a configuration transfers between step budgets;
    the defaults are the paper's guideline (section 4.3)."""

    name: Literal["ab", "ab-nogroups"] = "ab"
    warmup_frac: float = Field(0.20, ge=0.0, lt=1.0, description="full-rank warmup, fraction of all steps")
    ab_frac: Fraction = Field(1 / 30, description="numABSteps as a fraction of all steps")
    rebound_frac: float = Field(0.25, ge=0.0, le=10.0, description="fullRankReboundSteps / numABSteps")
    lr_rebound_frac: float = Field(0.5, ge=0.0, le=10.0, description="LR rebound steps / numABSteps")
    sigma_cutoff: Fraction = Field(0.1, description="keep singular values > cutoff * largest")
    rank_cap: float | None = Field(
        1.0, gt=0.0, le=1.0,
        description="factor a weight (m x n, rank r) only if its factors hold at most this fraction of its "
                    "entries, r(m+n) <= rank_cap * mn, and never at r(m+n) >= mn; else it stays full rank "
                    "during the AB phase. null: factor every eligible weight whatever r",
    )
    lr_rebound_floor: float = Field(
        1e-5, ge=0.0, description="learning rate of the first step after a change of shape (the authors' code: 1e-5)"
    )
    group_size: int | None = Field(None, ge=1, description="ranks per independent group; default ranks per node")
    sync_mode: Literal["with-stale", "only-learned", "full"] = "with-stale"
    keep_full_rank: tuple[str, ...] = Field(
        (), description="extra module-name globs kept full rank (head and first layer always are)"
    )

    # The paper's guideline (section 4.3) and the default search space around it.
    guideline: ClassVar[Mapping[str, Any]] = {
        "warmup_frac": 0.2, "ab_frac": 1 / 30, "rebound_frac": 0.25, "lr_rebound_frac": 0.5, "sigma_cutoff": 0.1}
    default_space: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "warmup_frac": {"low": 0.1, "high": 0.3},
        "ab_frac": {"low": 0.015, "high": 0.07, "log": True},
        "rebound_frac": {"low": 0.1, "high": 0.5},
        "lr_rebound_frac": {"low": 0.25, "high": 1.0},
        "sigma_cutoff": {"low": 0.01, "high": 0.5, "log": True},
    }
    # What transfers between scales: fractions, the cutoff and the sync mode (never steps or batch sizes).
    promoted_fields: ClassVar[tuple[str, ...]] = (
        "warmup_frac", "ab_frac", "rebound_frac", "lr_rebound_frac", "sigma_cutoff", "sync_mode")
    schedule_fields: ClassVar[tuple[str, ...]] = ("warmup_frac", "ab_frac", "rebound_frac", "lr_rebound_frac")
    rank_fields: ClassVar[tuple[str, ...]] = ("sigma_cutoff", "rank_cap")
    schedule_columns: ClassVar[Mapping[str, str]] = {
        "warmup": "warmup_steps", "AB": "ab_steps", "rebound": "rebound_steps", "LR rebound": "lr_rebound_steps"}

    @property
    def grouped(self) -> bool:
        """`ab` trains A and B in independent groups; `ab-nogroups` (the paper's "No Group") over all ranks."""
        return self.name == "ab"

    def check_layout(self, world_size: int, ranks_per_node: int, nodes: int) -> None:
        if not self.grouped:
            return
        size = self.resolved_group_size(world_size, ranks_per_node, nodes)
        if nodes > 1 and size % ranks_per_node and ranks_per_node % size:
            raise ConfigError(
                f"method.group_size {size} and tasks_per_node {ranks_per_node}: AB's groups would straddle "
                f"nodes; choose ranks per node dividing {size} (or a group size dividing {ranks_per_node})"
            )

    def resolved_group_size(self, world_size: int, ranks_per_node: int, num_nodes: int) -> int:
        """Ranks per independent group. Default: one group per node; on a single node, two groups of half the ranks."""
        if self.group_size is not None:
            size = self.group_size
        elif num_nodes > 1:
            size = ranks_per_node
        else:
            size = max(1, world_size // 2)
        _check_groups(size, world_size)
        return size

    def phase_schedule(self, total_steps: int) -> ABSchedule:
        return ABSchedule.from_config(self, total_steps)

    @classmethod
    def schedule_text(cls, steps: Mapping[str, int]) -> str:
        return (f"warmup {steps['warmup_steps']}, AB {steps['ab_steps']} x{steps['ab_cycles']}, "
                f"rebound {steps['rebound_steps']}, LR rebound {steps['lr_rebound_steps']}")

    @classmethod
    def nothing_factored_text(cls, weights: Mapping[str, Any]) -> str:
        cutoffs = [w["factors_from_cutoff"] for w in weights.values() if w["factors_from_cutoff"] is not None]
        return f" (from sigma_cutoff {min(cutoffs):.3g})" if cutoffs else " (no cutoff would: see rank_cap)"

    def spectrum_cutoff(self) -> float:
        return self.sigma_cutoff

    def derived_params(self, total_steps: int, ranks_per_node: int) -> dict[str, Any]:
        steps = self.phase_schedule(total_steps).describe()
        params: dict[str, Any] = {f"method.{k}": v for k, v in steps.items() if k != "total_steps"}
        if self.grouped:
            params["group_size"] = self.group_size or ranks_per_node
        return params


def _check_groups(size: int, world_size: int) -> None:
    """AB gives half of the groups A and half B: at least two groups, an even number, of equal size."""
    if world_size < 2:
        raise ConfigError("method ab needs at least 2 ranks (one A group and one B group); use --nproc 2 or more, or method ab-nogroups")
    if world_size % size:
        raise ConfigError(f"method.group_size: {size} does not divide the {world_size} ranks; choose a divisor of {world_size}")
    if world_size // size < 2:
        raise ConfigError(
            f"method.group_size: {size} leaves a single group of {world_size} ranks; AB-training needs at least "
            f"2 groups (one trains A, one trains B): choose at most {world_size // 2}"
        )
    if (world_size // size) % 2:
        even = [d for d in range(1, world_size // 2 + 1) if world_size % d == 0 and (world_size // d) % 2 == 0]
        if not even:  # an odd number of ranks: no group size helps
            raise ConfigError(
                f"method ab needs an even number of ranks (half of its equal groups train A, half B), got "
                f"{world_size}: use --nproc {world_size - 1} or {world_size + 1} (nodes x tasks_per_node in a "
                "launcher profile), or method ab-nogroups")
        raise ConfigError(
            f"method.group_size: {size} makes {world_size // size} groups of the {world_size} ranks (default: one "
            f"group per node); AB-training "
            f"gives half of the groups A and half B, so it needs an even number: choose one of "
            f"{', '.join(map(str, even))}"
        )


# --- the phase schedule (see the module's docstring) ---------------------------------------
AB_PHASES = (Phase.WARMUP, Phase.AB, Phase.REBOUND)  # the phases of AB's segments


def round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


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

    def steps_by_phase(self, steps_done: int) -> dict[Phase, int]:
        """How many of the first `steps_done` steps each phase had."""
        done = dict.fromkeys(AB_PHASES, 0)
        for segment in self.segments:
            done[segment.phase] += max(0, min(segment.end, steps_done) - segment.start)
        return done

    def syncs_done(self, steps_done: int) -> int:
        """AB phases whose factors had been averaged once `steps_done` steps had run: an AB phase that
        ends at step e (exclusive) syncs as step e begins, or as the run finishes when e ends the run."""
        return sum(1 for s in self.segments if s.phase is Phase.AB
                   and (s.end < steps_done or s.end == steps_done == self.total_steps))

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
