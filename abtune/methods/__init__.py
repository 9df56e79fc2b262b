"""Training methods, looked up by the `method.name` of the run config.

Each method is one package: its `method.py` (the `Method`, torch) and its `settings.py` (a
`MethodSettings` whose `name` field is a Literal of the names it answers to, and which declares what
is searchable, promoted and shown; torch-free, so the configuration, the CLI and the study read it
without importing torch) under a light `__init__.py`. Adding a method is that package and one line
in METHODS: the run config's `method:` section, `compare --methods`, the study's default space and
guideline, promotion and the study's checks follow from it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from abtune.methods.ab.settings import AbConfig
from abtune.methods.ddp.settings import DdpConfig
from abtune.methods.fp16.settings import Fp16Config
from abtune.methods.powersgd.settings import PowerSgdConfig
from abtune.methods.sbc.settings import SbcConfig
from abtune.methods.settings import MethodSettings

if TYPE_CHECKING:
    from abtune.methods.base import Method, MethodContext

# name -> (its settings, its Method as "module:Class", imported only when a run builds it)
METHODS: dict[str, tuple[type[MethodSettings], str]] = {
    "ddp": (DdpConfig, "abtune.methods.ddp.method:DDP"),
    "ab": (AbConfig, "abtune.methods.ab.method:ABTraining"),
    "ab-nogroups": (AbConfig, "abtune.methods.ab.method:ABTraining"),
    "sbc": (SbcConfig, "abtune.methods.sbc.method:SparseBinaryCompression"),
    "powersgd": (PowerSgdConfig, "abtune.methods.powersgd.method:PowerSGD"),
    "fp16": (Fp16Config, "abtune.methods.fp16.method:Fp16"),
}
METHOD_NAMES = tuple(METHODS)
METHOD_CONFIGS: dict[str, type[MethodSettings]] = {name: settings for name, (settings, _) in METHODS.items()}
# The run config's `method:` section: any method's settings, told apart by `name`.
MethodConfig = Annotated[Union[tuple(dict.fromkeys(METHOD_CONFIGS.values()))], Field(discriminator="name")]  # type: ignore[valid-type]  # noqa: UP007


def declared_keys(declaration: str) -> tuple[str, ...]:
    """The dotted keys (`method.FIELD`) that any registered method lists in one of its settings' declarations
    (`promoted_fields`, `schedule_fields`, `rank_fields`, ...), in registry order."""
    return tuple(dict.fromkeys(key for settings in METHOD_CONFIGS.values()
                               for key in settings.keys(getattr(settings, declaration))))


def declaring(key: str, declaration: str) -> type[MethodSettings] | None:
    """The first registered method whose settings list the dotted `key` in `declaration`; None: none does."""
    return next((s for s in METHOD_CONFIGS.values() if key in s.keys(getattr(s, declaration))), None)


def build_method(config: Any, ctx: MethodContext) -> Method:
    module_name, class_name = METHODS[config.name][1].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config, ctx)


__all__ = ["METHODS", "METHOD_CONFIGS", "METHOD_NAMES", "MethodConfig", "build_method", "declared_keys", "declaring"]
