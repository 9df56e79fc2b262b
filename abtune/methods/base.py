"""The interface every training method implements.

The trainer owns the loop: data, forward, backward, learning rate, optimizer step, evaluation,
checkpoints. A method owns everything about distribution: how the model is wrapped, which
parameters are trained, its process groups and every collective (through the comm meter). The
trainer calls, in this order::

    setup(model, broadcast_initial)       once, after the model is built
    upgrade_checkpoint(saved)             when resuming: an earlier version's checkpoint as this one writes it
    load_state_dict(state)                when resuming, before the model's own state is loaded
    per step: begin_step(step) -> forward(module) -> backward -> optimizer.step() -> end_step(step)
    eval_module()                         whenever the trainer evaluates
    finish()                              once, after the last step
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from abtune.comm import CommMeter, broadcast_tensors_
from abtune.dist import DistEnv
from abtune.phases import Phase

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class MethodContext:
    env: DistEnv
    meter: CommMeter
    total_steps: int
    make_optimizer: OptimizerFactory
    make_dense_model: Callable[[], nn.Module]
    note: Callable[[str], None] = lambda line: None  # a line for the user (the trainer prints rank 0's)


@dataclass(frozen=True)
class ParameterCounts:
    dense: int
    current: int
    trainable: int

    @property
    def compression(self) -> float:
        """Dense parameters per parameter of the current model (the x in x:1)."""
        return self.dense / self.current


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What a rank holds for training, in bytes: the model's parameters, their gradients (after a backward)
    and the optimizer's state (after its first step: AdamW's two moments and step count per parameter)."""
    parameters = sum(p.nbytes for p in model.parameters())
    gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return {"parameters": parameters, "gradients": gradients, "optimizer_state": state,
            "total": parameters + gradients + state}


class Method(ABC):
    name: ClassVar[str]

    def __init__(self, config: Any, ctx: MethodContext) -> None:
        self.config = config
        self.ctx = ctx
        self.meter = ctx.meter
        self.world = ctx.meter.world()
        self.model: nn.Module
        self.module: nn.Module  # what the trainer calls forward on (a DDP wrapper, usually)
        self.optimizer: torch.optim.Optimizer
        self.dense_parameters = 0
        self.held_bytes_by_phase: dict[str, dict[str, int]] = {}

    def setup(self, model: nn.Module, *, broadcast_initial: bool) -> None:
        """Take the freshly built model; make every rank start from rank 0's weights."""
        self.model = model
        self.dense_parameters = count_parameters(model)
        if broadcast_initial:
            self.meter.phase = Phase.SETUP
            broadcast_tensors_(self.meter, [*model.parameters(), *model.buffers()], 0, self.world)
        self._setup()

    @abstractmethod
    def _setup(self) -> None:
        """Wrap `self.model`, set `self.module` and `self.optimizer`."""

    @abstractmethod
    def begin_step(self, step: int) -> None:
        """Called before the forward pass of `step`: phase changes happen here; set `meter.phase`."""

    def end_step(self, step: int) -> None:
        """Called after the optimizer step of `step`."""

    def learning_rate(self, step: int, scheduled: float) -> float:
        """The learning rate of `step`, given the base schedule's (AB replaces it by its rebound)."""
        return scheduled

    @property
    @abstractmethod
    def phase(self) -> str:
        """The phase of the last step begun (warmup, ab, rebound, train, ...)."""

    def eval_module(self) -> nn.Module:
        """A module holding the model every rank agrees on, ready to evaluate."""
        return self.model

    def finish(self) -> None:
        """Bring the model to its final, synchronized form after the last step."""

    def parameter_counts(self) -> ParameterCounts:
        return ParameterCounts(
            self.dense_parameters, count_parameters(self.model), count_parameters(self.model, trainable_only=True)
        )

    def trained_model_counts(self) -> ParameterCounts:
        """Parameter counts of the model being trained, the model whose compression the AB paper
        reports: AB's at its latest decomposition, every other method's current model."""
        return self.parameter_counts()

    def compression_ratio(self) -> float:
        """The method's own compression figure, x in x:1: AB's parameter compression during its AB
        phases, SBC's and PowerSGD's update compression, fp16's 2:1. Measured traffic against DDP is
        reported separately (`traffic.reduction_vs_ddp`)."""
        return 1.0

    def compressed_model(self) -> bool:
        """Whether the model being trained was compressed (AB after its first decomposition): the AB
        paper's estimated communication reduction (equation 4) applies only then."""
        return False

    def predict_training_bytes(self, so_far: dict[str, float], steps_done: int) -> float | None:
        """The training bytes (one kind: all, or inter-node) this run will have sent after its last step,
        from what each phase sent in its first `steps_done` steps; None while that cannot be known. Here: a
        steady rate per step, exact for DDP and fp16, within one exchange for SBC; AB predicts from its
        schedule."""
        sent = sum(so_far.values())
        return sent * self.ctx.total_steps / steps_done if steps_done else sent

    def _count_held_bytes_after_next_step(self) -> None:
        """Count `held_bytes` once the new optimizer has stepped (gradients and moments exist then); per phase,
        the most any of its stretches held."""
        def count(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            handle.remove()
            held, before = held_bytes(self.model, optimizer), self.held_bytes_by_phase.get(self.phase)
            if before is None or held["total"] > before["total"]:
                self.held_bytes_by_phase[self.phase] = held

        handle = self.optimizer.register_step_post_hook(count)

    def summary(self) -> dict[str, Any]:
        """Method-specific entries for summary.json."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore structure (factor shapes, wrappers, optimizer) so the saved tensors fit."""

    def upgrade_checkpoint(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint written by an earlier version, as this one writes it (parameters renamed, say)."""
        return saved

    def rebuild_optimizer(self, params: list[nn.Parameter], keep_state: bool = True) -> None:
        """A new optimizer over `params` that keeps the state of parameters it already knew.

        Parameters that are new (re-shaped factors or rebuilt weights) start with fresh moments:
        their old moments have the wrong shape or meaning. `keep_state=False` drops every moment,
        for when ranks' moments have diverged and keeping them would make the ranks drift apart.
        """
        old = getattr(self, "optimizer", None)
        self.optimizer = self.ctx.make_optimizer(params)
        self._count_held_bytes_after_next_step()
        if old is None or not keep_state:
            return
        for param in params:
            if param in old.state:
                self.optimizer.state[param] = old.state[param]
