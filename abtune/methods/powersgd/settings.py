"""The settings of `method: powersgd` (abtune/methods/powersgd/method.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from abtune.methods.settings import MethodSettings


class PowerSgdConfig(MethodSettings):
    """PyTorch's PowerSGD DDP comm hook (Vogels et al. 2019): rank-r gradient approximations."""

    name: Literal["powersgd"] = "powersgd"
    rank: int = Field(2, ge=1, description="matrix approximation rank")
    start_step: int = Field(10, ge=2, description="plain all-reduce before this step (PyTorch needs > 1)")
    min_compression_rate: float = Field(2.0, ge=1.0, description="compress a matrix only if it shrinks this much")
    error_feedback: bool = True
    warm_start: bool = True
