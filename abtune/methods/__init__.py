"""Training methods: one module each, looked up by the `method.name` of the run config."""

from __future__ import annotations

import importlib

from abtune.methods.base import Method, MethodContext

_REGISTRY: dict[str, str] = {
    "ddp": "abtune.methods.ddp:DDP",
    "ab": "abtune.methods.ab:ABTraining",
    "ab-nogroups": "abtune.methods.ab:ABTraining",
    "sbc": "abtune.methods.sbc:SparseBinaryCompression",
    "powersgd": "abtune.methods.powersgd:PowerSGD",
    "fp16": "abtune.methods.fp16:Fp16",
}
METHOD_NAMES = tuple(_REGISTRY)


def build_method(config: object, ctx: MethodContext) -> Method:
    module_name, class_name = _REGISTRY[config.name].split(":")  # type: ignore[attr-defined]
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config, ctx)


__all__ = ["METHOD_NAMES", "Method", "MethodContext", "build_method"]
