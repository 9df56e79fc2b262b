"""The settings of `method: sbc` (abtune/methods/sbc/method.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from abtune.methods.settings import MethodSettings


class SbcConfig(MethodSettings):
    """Sparse Binary Compression (Sattler et al. 2018): communication delay, top-k sparsification,
    binarization, Golomb-coded positions, error feedback."""

    name: Literal["sbc"] = "sbc"
    delay: int = Field(10, ge=1, description="local optimizer steps between exchanges of the accumulated update")
    sparsity: float = Field(0.01, gt=0.0, le=1.0, description="fraction of each tensor's entries sent (per side)")
    binarize: bool = Field(True, description="send one mean per tensor instead of the kept values")
