"""The base of every method's settings: what the layers above `abtune/methods/` may ask of a method
without naming it or its fields. Torch-free, like every method's settings module, so the configuration,
the CLI, the study and promote read them without importing torch or the method.

A method declares here, on its settings class, what the layers above read of it: which of its fields a
study searches by default and around which published values (`default_space`, `guideline`), which
carry into a scaling campaign (`promoted_fields`), which act only through its phase schedule or its
chosen ranks (`schedule_fields`, `rank_fields`: how a study tells that a searched field changed
nothing), and what its schedule and spectra plot show. Field names are the method's own; the study
and promote see them as dotted run-config keys (`method.FIELD`, `keys`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from abtune.methods.schedule import PhaseSchedule
from abtune.schema import StrictModel

SECTION = "method"  # the run config's section of a method's settings


class MethodSettings(StrictModel):
    """A method's config section (`method:` of a run config); `name` is a Literal of the names it answers to."""

    # field -> its published value: a study's paper-defaults reference trial; empty: no such trial
    guideline: ClassVar[Mapping[str, Any]] = {}
    # field -> a study dimension ({low, high, log} or {choices}): the space of a study file that gives none
    default_space: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    # fields a promoted trial carries into a scaling campaign (abtune promote); empty: never promoted
    promoted_fields: ClassVar[tuple[str, ...]] = ()
    # fields that act only through the phase schedule in steps (fractions that round to whole steps)
    schedule_fields: ClassVar[tuple[str, ...]] = ()
    # fields that act only through the ranks chosen at the first decomposition and the model's compression
    rank_fields: ClassVar[tuple[str, ...]] = ()
    # header -> key of the schedule's describe(): its columns in promote's campaign table
    schedule_columns: ClassVar[Mapping[str, str]] = {}

    @staticmethod
    def keys(fields: Iterable[str]) -> tuple[str, ...]:
        """Fields as the study and promote name them: dotted run-config keys (`method.FIELD`)."""
        return tuple(f"{SECTION}.{field}" for field in fields)

    def check_layout(self, world_size: int, ranks_per_node: int, nodes: int) -> None:
        """Refuse (ConfigError) a layout the method cannot run on, before anything is submitted."""

    def phase_schedule(self, total_steps: int) -> PhaseSchedule | None:
        """The method's phases in absolute steps; None: one phase, `train`, for the whole run."""
        return None

    @classmethod
    def schedule_text(cls, steps: Mapping[str, int]) -> str:
        """A schedule's describe() in words, for tables and notes."""
        return ", ".join(f"{key} {value}" for key, value in steps.items())

    @classmethod
    def decomposition_text(cls, decomposition: Mapping[str, Any]) -> str:
        """`8 of 8 weights, ranks 13-65 (step 60)`: what a method that factors weights kept at a decomposition."""
        weights = decomposition.get("weights", {})
        ranks = sorted(decomposition["ranks"].values())
        text = f"{len(ranks)} of {len(weights)} weights"
        if ranks:
            text += f", rank{'s' if len(ranks) > 1 else ''} {ranks[0]}" + (f"-{ranks[-1]}" if ranks[-1] != ranks[0] else "")
        else:
            text += cls.nothing_factored_text(weights)
        return f"{text} (step {decomposition['step']})"

    @classmethod
    def nothing_factored_text(cls, weights: Mapping[str, Any]) -> str:
        """Appended when a decomposition factored nothing: which setting would change that."""
        return ""

    def derived_params(self, total_steps: int, ranks_per_node: int) -> dict[str, Any]:
        """Values the method derives from its fields and the layout, recorded beside them by the trackers."""
        return {}

    def spectrum_cutoff(self) -> float | None:
        """The relative singular-value cutoff the run's spectra plot marks; None: nothing to mark."""
        return None
