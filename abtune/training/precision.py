"""Mixed precision: autocast on the run's device and, for fp16, a gradient scaler.

Parameters, gradients and optimizer state stay fp32 under every precision: autocast only runs the
forward pass's matmuls and convolutions in bf16/fp16. So everything a method does between steps
(AB's SVD, rank agreement and factor averaging, SBC's residuals, PowerSGD's error feedback, the
gradients DDP all-reduces) stays fp32 without any method knowing the precision.

fp16's range is small: the loss is multiplied by a scale before backward; a step whose gradients
overflow is skipped (the optimizer does not move) and the scale is halved. A skipped step is
counted, it is not a failure. bf16 has fp32's range and needs no scaler.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, name: str, device: torch.device, loss_scale: float) -> None:
        self.name = name
        self.device = device
        self.scaler = torch.amp.GradScaler(device.type, init_scale=loss_scale) if name == "fp16" else None

    def autocast(self) -> AbstractContextManager[Any]:
        """Wrap forward passes (training and evaluation) in this."""
        if self.name not in AUTOCAST_DTYPES:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.name])

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradients true gradients (before clipping them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer step; False when fp16's scaler skipped it (inf/NaN gradients: the scale drops)."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale

    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
