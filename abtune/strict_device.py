"""Strict-device mode: a GPU run's device mistakes, visible on a CPU-only machine.

On a GPU node a tensor made without `device=` lives on the CPU, and NCCL refuses it at the first
collective ("No backend type associated with device type cpu"). On a CPU run the same tensor is on
the run's device and gloo takes it, so no CPU test could see the mistake. In strict-device mode
(`ABTUNE_STRICT_DEVICE=1` in a rank's environment) a TorchFunctionMode remembers which tensors a
GPU run would hold on the CPU, by their storage:

- made by a factory (`torch.tensor`, `zeros`, `arange`, `randperm`, ...) without a device, or by
  `.cpu()`;
- made by an operation whose tensor inputs are all such tensors (views share their storage).

`.to(device)` and `.cuda()` give such a tensor a fresh, unmarked copy, as a real move would. The
meter refuses a marked tensor exactly as it refuses a tensor on another device. An explicit
`device=` is trusted (on a CPU run `device="cpu"` and `device=env.device` look alike), and
`torch.from_numpy`/`torch.frombuffer` are invisible to the mode (torch does not route them through it).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

STRICT_DEVICE_VARIABLE = "ABTUNE_STRICT_DEVICE"

_FACTORIES = frozenset({
    torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor, torch.zeros, torch.ones, torch.empty,
    torch.empty_strided, torch.full, torch.arange, torch.range, torch.linspace, torch.logspace, torch.eye,
    torch.rand, torch.randn, torch.randint, torch.randperm,
})
_ALWAYS_ON_CPU = frozenset({torch.Tensor.cpu})
_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})
_IN_PLACE_EXTRA = frozenset({torch.Tensor.__setitem__, torch.Tensor.set_, torch.Tensor.data.__set__})


def requested() -> bool:
    return os.environ.get(STRICT_DEVICE_VARIABLE, "") not in ("", "0")


class _ForeignTracker(TorchFunctionMode):
    """Marks the storages a GPU run would keep on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self._foreign: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    def is_foreign(self, tensor: torch.Tensor) -> bool:
        storage = _storage(tensor)
        return storage is not None and storage in self._foreign

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        result = func(*args, **kwargs)
        if func in _MOVES and _names_a_device(func, args, kwargs):
            return self._moved(args[0], result)
        if func in _ALWAYS_ON_CPU or (func in _FACTORIES and kwargs.get("device") is None and not inputs):
            if result is (args[0] if args else None):  # `.cpu()` of a CPU tensor returns itself; a move copies
                result = result.clone()
            self._mark(result)
        elif inputs and not _in_place(func) and all(self.is_foreign(t) for t in inputs):
            self._mark(result)
        return result

    def _moved(self, source: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        if result is source and self.is_foreign(source):
            return source.clone()  # a real move copies; the copy is on the run's device
        return result

    def _mark(self, result: Any) -> None:
        for tensor in pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor) and tensor.is_cpu and (storage := _storage(tensor)) is not None:
                self._foreign.add(storage)


def _storage(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested or wrapper tensors have none
        return None


def _names_a_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if func is torch.Tensor.cuda:
        return True
    candidates = [*args[1:2], kwargs.get("device")]
    return any(isinstance(c, (str, int, torch.device, torch.Tensor)) for c in candidates)


def _in_place(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return func in _IN_PLACE_EXTRA or (name.endswith("_") and not name.endswith("__"))


_active: _ForeignTracker | None = None


def active() -> bool:
    return _active is not None


def is_foreign(tensor: torch.Tensor) -> bool:
    """True when strict-device mode is on and a GPU run would hold `tensor` on the CPU."""
    return _active is not None and _active.is_foreign(tensor)


@contextmanager
def strict_devices(enabled: bool) -> Iterator[None]:
    """Track foreign tensors while the block runs (a no-op unless `enabled`)."""
    global _active
    if not enabled:
        yield
        return
    tracker = _ForeignTracker()
    _active = tracker
    try:
        with tracker:
            yield
    finally:
        _active = None
