"""DDP with PyTorch's PowerSGD comm hook (rank-r approximation of each gradient matrix).

The built-in hook issues its own all-reduces (P, Q and the uncompressed rest). It keeps exact
running counts of the elements it sends (`total_numel_after_compression`), so the metered hook
records the difference of that counter around each call; before `start_step` it sends the whole
bucket. Its three all-reduces (the uncompressed rest, P, Q) are recorded one by one, for their messages.

No `from __future__ import annotations`: DDP checks the comm hook's annotations at run time.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from abtune.comm import Op
from abtune.methods.ddp.method import DDP, DataParallel, MeteredHookState

# Resuming keeps the iteration, the random state and the counters, but not the error-feedback and
# warm-start memories: they are keyed by DDP bucket index, and a rebuilt DDP may order its buckets
# differently, which would add each remembered error to the wrong gradient entries.
_RESUMABLE_SLOTS = ("rng", "iter", "total_numel_before_compression", "total_numel_after_compression")


@dataclass
class MeteredPowerSgdState(MeteredHookState):
    powersgd: Any = None


def metered_powersgd_hook(state: MeteredPowerSgdState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.buckets_seen.add(bucket.index())
    state.meter.check_device(Op.ALL_REDUCE, state.group, bucket.buffer())
    inner = state.powersgd
    compressing = inner.iter >= inner.start_powerSGD_iter
    sent_before = inner.total_numel_after_compression
    future = powersgd.powerSGD_hook(inner, bucket)
    buffer, element = bucket.buffer(), bucket.buffer().element_size()
    if not compressing:
        state.meter.record(Op.ALL_REDUCE, buffer.nbytes, state.group, element_size=element)
        return future
    # Three all-reduces, one after the other: the uncompressed rest, the Ps, the Qs (their own messages each).
    p, q = (memory[bucket.index()].numel() for memory in (inner.p_memory_dict, inner.q_memory_dict))
    rest = inner.total_numel_after_compression - sent_before - p - q
    for numel in (rest, p, q):
        state.meter.record(Op.ALL_REDUCE, numel * element, state.group, element_size=element)
    return future


class PowerSGD(DDP):
    name = "powersgd"

    def _setup(self) -> None:
        cfg = self.config
        inner = powersgd.PowerSGDState(
            process_group=self.world.handle, matrix_approximation_rank=cfg.rank, start_powerSGD_iter=cfg.start_step,
            min_compression_rate=cfg.min_compression_rate, use_error_feedback=cfg.error_feedback,
            warm_start=cfg.warm_start, random_seed=0,
        )
        self.hook_state = MeteredPowerSgdState(self.meter, self.world, powersgd=inner)
        self.module = DataParallel(self.model, self.world, self.meter, metered_powersgd_hook, self.hook_state)
        self.rebuild_optimizer([p for p in self.model.parameters() if p.requires_grad])

    def compression_ratio(self) -> float:
        inner = self.hook_state.powersgd
        after = inner.total_numel_after_compression
        return inner.total_numel_before_compression / after if after else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {slot: getattr(self.hook_state.powersgd, slot) for slot in _RESUMABLE_SLOTS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for slot, value in state.items():
            setattr(self.hook_state.powersgd, slot, value)
