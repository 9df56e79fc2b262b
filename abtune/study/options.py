"""Sampler and pruner `options` checked against the Optuna constructor they are passed to.

The valid names, their types and defaults come from the constructor's signature, so they follow
Optuna; constructing the object then catches the ranges Optuna checks itself. `LOWER_BOUNDS` holds
the ranges Optuna accepts silently and fails on only when a trial is sampled or pruned.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError

from abtune.errors import ConfigError

# name -> (bound, inclusive): values Optuna's constructors take without complaint but cannot use.
LOWER_BOUNDS: dict[str, tuple[float, bool]] = {
    "n_startup_trials": (0, True),  # TPE, GP, CMA-ES, median
    "n_ei_candidates": (1, True),  # TPE
    "prior_weight": (0, False),  # TPE
    "dividing_parameter": (1, True),  # NSGA-III
    "popsize": (1, True),  # CMA-ES
    "sigma0": (0, False),  # CMA-ES
    "min_resource": (1, True),  # Hyperband
    "max_resource": (1, True),  # Hyperband (or "auto")
    "reduction_factor": (2, True),  # Hyperband
    "bootstrap_count": (0, True),  # Hyperband
}
_PLAIN = (bool, int, float, str, type(None))


class Option(NamedTuple):
    name: str
    type: Any  # evaluated annotation
    shown_type: str  # as written in Optuna's signature
    default: Any


def check_options(factory: Callable[..., Any], options: dict[str, Any], where: str,
                  reserved: dict[str, str] | None = None) -> None:
    """Refuse, in one line, an option `factory` does not take, or takes with another type or range.

    `where` names the section in messages (`sampler.options`); `reserved` maps options abtune sets
    itself to what to do instead.
    """
    reserved = reserved or {}
    settable = settable_options(factory, exclude=reserved)
    for key, value in options.items():
        if key in reserved:
            raise ConfigError(f"{where}.{key}: {reserved[key]}")
        if key not in settable:
            raise ConfigError(_unknown(factory, key, settable, where))
        _check_type(settable[key], value, where)
        _check_bound(key, value, where)


def settable_options(factory: Callable[..., Any], exclude: dict[str, str]) -> dict[str, Option]:
    """The keyword parameters of `factory` a YAML file can give (plain values, lists, mappings)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    options = {}
    for parameter in inspect.signature(factory).parameters.values():
        kind = _from_yaml(_annotation(factory, parameter))
        if parameter.kind in named and parameter.name not in exclude and kind is not None:
            shown = kind.__name__ if isinstance(kind, type) else str(parameter.annotation)
            options[parameter.name] = Option(parameter.name, kind, shown, parameter.default)
    return options


def _annotation(factory: Callable[..., Any], parameter: inspect.Parameter) -> Any:
    """The evaluated annotation, or None when it names something only the module's type checker imports."""
    annotation = parameter.annotation
    if not isinstance(annotation, str):
        return annotation
    namespace = getattr(getattr(factory, "__init__", factory), "__globals__", {})
    try:
        return eval(annotation, dict(namespace))  # noqa: S307 (Optuna's own annotation text)
    except (NameError, AttributeError, TypeError):
        return None  # e.g. Callable[...] or FrozenTrial under `if TYPE_CHECKING:`: not for a YAML file


def _from_yaml(annotation: Any) -> Any:
    """`annotation` when YAML can produce its values, else None (callables, samplers, arrays)."""
    if annotation is Any or annotation in _PLAIN:
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return annotation
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        members = [a for a in args if a is not Ellipsis]
        return annotation if members and all(_from_yaml(a) is not None for a in members) else None
    return None


def _check_type(option: Option, value: Any, where: str) -> None:
    try:
        TypeAdapter(option.type).validate_python(value, strict=True)
    except ValidationError:
        raise ConfigError(f"{where}.{option.name}: expected {option.shown_type}, got {value!r} "
                          f"({type(value).__name__}); default: {option.default!r}") from None


def _check_bound(key: str, value: Any, where: str) -> None:
    if key not in LOWER_BOUNDS or isinstance(value, bool) or not isinstance(value, int | float):
        return
    bound, inclusive = LOWER_BOUNDS[key]
    if value < bound or (value == bound and not inclusive):
        rule = f">= {bound}" if inclusive else f"> {bound}"
        raise ConfigError(f"{where}.{key}: must be {rule}, got {value}")


def _unknown(factory: Callable[..., Any], key: str, settable: dict[str, Option], where: str) -> str:
    name = getattr(factory, "__qualname__", str(factory))
    parameter = inspect.signature(factory).parameters.get(key)
    if parameter is not None and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        return (f"{where}.{key}: {name} takes a Python object here ({parameter.annotation}), "
                "which a study file cannot give; remove it")
    if not settable:
        return f"{where}.{key}: {name} takes no options; remove {where}"
    valid = ", ".join(f"{p.name} (default {p.default!r})" for p in settable.values())
    return f"{where}.{key}: not an option of {name}; valid options: {valid}"
