"""The base of every typed section of abtune's files: run configs, method settings, study files, launcher
profiles. A leaf: the configuration and each method's settings stand on it."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]


class StrictModel(BaseModel):
    """Unknown keys refused (a typo fails before any process starts), values frozen, defaults validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
