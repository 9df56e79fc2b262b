"""The settings of `method: ddp` (abtune/methods/ddp/method.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from abtune.methods.settings import MethodSettings


class DdpConfig(MethodSettings):
    """Traditional full-rank data parallelism (PyTorch DDP)."""

    name: Literal["ddp"] = "ddp"
    comm_hook: Literal["allreduce", "noop"] = Field(
        "allreduce",
        description="noop skips the gradient exchange: the zero-communication floor for benchmarks (ranks drift apart)",
    )
