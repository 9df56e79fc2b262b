"""DDP with PyTorch's fp16 compression hook: gradients cross the wire in half precision (2:1).

No `from __future__ import annotations`: DDP checks the comm hook's annotations at run time.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from abtune.comm import Op
from abtune.methods.ddp.method import DDP, DataParallel, MeteredHookState

FP16_BYTES = 2


def metered_fp16_hook(state: MeteredHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Counts the half-precision copy of each bucket that the built-in hook all-reduces."""
    state.buckets_seen.add(bucket.index())
    state.meter.check_device(Op.ALL_REDUCE, state.group, bucket.buffer())
    state.meter.record(Op.ALL_REDUCE, bucket.buffer().numel() * FP16_BYTES, state.group, element_size=FP16_BYTES)
    return default_hooks.fp16_compress_hook(state.group.handle, bucket)


class Fp16(DDP):
    name = "fp16"

    def _setup(self) -> None:
        self.module = DataParallel(self.model, self.world, self.meter, metered_fp16_hook)
        self.rebuild_optimizer([p for p in self.model.parameters() if p.requires_grad])

    def compression_ratio(self) -> float:
        return next(self.model.parameters()).element_size() / FP16_BYTES
