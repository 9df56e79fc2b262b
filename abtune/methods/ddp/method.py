"""Traditional full-rank data parallelism, and the DDP wrapper every method uses for its
data-parallel phases (gradients averaged by a metered all-reduce comm hook).

No `from __future__ import annotations` here: DDP checks the comm hook's annotations at run time.
"""


import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from abtune.comm import CommGroup, CommMeter, Op, average_tensors_
from abtune.methods.base import Method
from abtune.phases import Phase

# torch 2.13 renamed DDP's broadcast_buffers to forward_sync_buffers (2.14 warns on the old name); 2.12 and
# older, such as the torch 2.11 of the GPU images this project was checked on, know only the old name.
NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)

INT32_BYTES = 4


@dataclass
class MeteredHookState:
    meter: CommMeter
    group: CommGroup
    buckets_seen: set[int] = field(default_factory=set)


CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def metered_allreduce_hook(state: MeteredHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: counts each gradient bucket, then averages it with a plain all-reduce."""
    state.buckets_seen.add(bucket.index())
    buffer = bucket.buffer()
    state.meter.check_device(Op.ALL_REDUCE, state.group, buffer)
    state.meter.record(Op.ALL_REDUCE, buffer.nbytes, state.group, element_size=buffer.element_size())
    return default_hooks.allreduce_hook(state.group.handle, bucket)


def noop_hook(state: MeteredHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Exchange nothing: each rank keeps its own gradient (a timing floor, not a training method)."""
    state.buckets_seen.add(bucket.index())
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


class DataParallel(nn.Module):
    """DDP over `group` with no collectives hidden from the meter.

    `init_sync=False`: DDP does not broadcast rank 0's weights when it is (re)built, so a wrapper
    rebuilt after a change of shape never silently overwrites parameters; methods synchronize
    explicitly and metered. `forward_sync_buffers=False`: buffers are averaged explicitly (before
    evaluation and at AB syncs) instead of broadcast from rank 0 at every forward.
    """

    def __init__(self, model: nn.Module, group: CommGroup, meter: CommMeter,
                 hook: CommHook = metered_allreduce_hook, hook_state: MeteredHookState | None = None) -> None:
        super().__init__()
        self.group = group
        self.meter = meter
        meter.check_device("DDP's gradient all-reduce", group, *model.parameters())
        self.ddp = DistributedDataParallel(
            model, process_group=group.handle, init_sync=False, **NO_FORWARD_BUFFER_SYNC
        )
        self._hook_state = hook_state or MeteredHookState(meter, group)
        self.ddp.register_comm_hook(self._hook_state, hook)
        self._steps = 0
        self._trainable = [p for p in model.parameters() if p.requires_grad]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._steps == 1:
            self._record_bucket_rebuild()
        self._steps += 1
        return self.ddp(*args, **kwargs)

    def _record_bucket_rebuild(self) -> None:
        # After its first backward, DDP's reducer re-orders its buckets and broadcasts the new
        # order from rank 0 inside C++ (Reducer::sync_bucket_indices): one int32 tensor of
        # (parameter indices + 1) and one of bucket sizes. The hook cannot see it; count it here.
        buckets = max(1, len(self._hook_state.buckets_seen))
        self.meter.record(Op.BROADCAST, (len(self._trainable) + 1) * INT32_BYTES, self.group)
        self.meter.record(Op.BROADCAST, buckets * INT32_BYTES, self.group)


def average_buffers_(model: nn.Module, meter: CommMeter, group: CommGroup) -> None:
    average_tensors_(meter, list(model.buffers()), group)


class DDP(Method):
    """Full-rank DDP over all ranks: the baseline."""

    name = "ddp"

    def _setup(self) -> None:
        hook = metered_allreduce_hook if self.config.comm_hook == "allreduce" else noop_hook
        self.module = DataParallel(self.model, self.world, self.meter, hook)
        self.rebuild_optimizer([p for p in self.model.parameters() if p.requires_grad])

    def begin_step(self, step: int) -> None:
        self.meter.phase = Phase.TRAIN

    @property
    def phase(self) -> str:
        return Phase.TRAIN.value

    def eval_module(self) -> nn.Module:
        self.meter.phase = Phase.EVAL
        average_buffers_(self.model, self.meter, self.world)
        return self.model
