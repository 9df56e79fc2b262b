"""The settings of `method: fp16` (abtune/methods/fp16/method.py)."""

from __future__ import annotations

from typing import Literal

from abtune.methods.settings import MethodSettings


class Fp16Config(MethodSettings):
    """PyTorch's fp16 compression DDP comm hook: gradients all-reduced in half precision."""

    name: Literal["fp16"] = "fp16"
