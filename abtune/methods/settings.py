"""The base of every method's settings: what the layers above `abtune/methods/` may ask of a method
without naming it. Torch-free, like every method's settings module, so the configuration, the CLI,
the study and promote read them without importing torch or the method."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from abtune.schema import StrictModel

if TYPE_CHECKING:
    from abtune.methods.ab.settings import ABSchedule


class MethodSettings(StrictModel):
    """A method's config section (`method:` of a run config); `name` is a Literal of the names it answers to."""

    promotable: ClassVar[bool] = False  # its searched fields carry into a scaling campaign (abtune promote)
    has_paper_defaults: ClassVar[bool] = False  # a study's paper-defaults reference trial applies to it

    def check_layout(self, world_size: int, ranks_per_node: int, nodes: int) -> None:
        """Refuse (ConfigError) a layout the method cannot run on, before anything is submitted."""

    def phase_schedule(self, total_steps: int) -> ABSchedule | None:
        """The method's phases in absolute steps; None: one phase, `train`, for the whole run."""
        return None

    def derived_params(self, total_steps: int, ranks_per_node: int) -> dict[str, Any]:
        """Values the method derives from its fields and the layout, recorded beside them by the trackers."""
        return {}
