"""The search space: dotted run-config fields -> Optuna distributions -> run-config overrides.

Every dimension names a field of the base config's RunConfig; its kind (int, float, categorical)
follows the field's type. At create time every endpoint and every choice is checked against the
RunConfig schema and the trial layout, so a trial never starts with a value the schema rejects.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from pydantic import BaseModel

from abtune.config import RunConfig, apply_overrides, parse_run_config
from abtune.errors import ConfigError
from abtune.launch.profiles import Layout, check_fits
from abtune.methods import METHOD_CONFIGS
from abtune.study.optuna_private import contains
from abtune.study.spec import Dimension, StudySpec

Kind = Literal["int", "float", "categorical"]
MAX_CHECKED_INTS = 256  # an int range up to this size has every value checked against the schema


def field_kind(base: dict[str, Any], dotted: str) -> tuple[Kind, list[Any] | None]:
    """The kind of a run-config field and, for a Literal, its valid values."""
    model: type[BaseModel] = RunConfig
    keys = dotted.split(".")
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        if model is RunConfig and key == "method" and not last:
            model = METHOD_CONFIGS[base["method"]["name"]]
            continue
        fields = model.model_fields
        if key not in fields:
            scope = ".".join(keys[:depth]) or "the run config"
            if keys[0] == "method":
                scope = f"method '{base['method']['name']}'"
            raise ConfigError(f"{dotted}: {key!r} is not a field of {scope}; valid: {', '.join(sorted(fields))}")
        annotation = fields[key].annotation
        is_section = key == "method" or (isinstance(annotation, type) and issubclass(annotation, BaseModel))
        if last and is_section:
            raise ConfigError(f"{dotted}: a section, not a field; search one of its fields")
        if last:
            return _kind_of(annotation)
        if not is_section:
            raise ConfigError(f"{dotted}: {'.'.join(keys[: depth + 1])} is a field, not a section")
        model = annotation
    raise AssertionError("unreachable")


def _kind_of(annotation: Any) -> tuple[Kind, list[Any] | None]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return "categorical", list(typing.get_args(annotation))
    if annotation is int:
        return "int", None
    if annotation is float:
        return "float", None
    return "categorical", None


def to_distribution(name: str, dim: Dimension, kind: Kind, literal: list[Any] | None) -> BaseDistribution:
    try:
        return _to_distribution(name, dim, kind, literal)
    except ValueError as error:  # Optuna's own checks, e.g. choices that are not plain values
        raise ConfigError(f"{name}: {error}") from None


def _to_distribution(name: str, dim: Dimension, kind: Kind, literal: list[Any] | None) -> BaseDistribution:
    if dim.choices is not None:
        return CategoricalDistribution(dim.choices)
    if kind == "categorical":
        valid = f": {', '.join(map(str, literal))}" if literal else ""
        raise ConfigError(f"{name}: this field takes choices, not a range; e.g. choices: [...]{valid}")
    if kind == "int":
        if not all(float(v).is_integer() for v in (dim.low, dim.high, dim.step or 1)):
            raise ConfigError(f"{name}: an integer field needs integer low/high/step, got low={dim.low}, high={dim.high}")
        return IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
    return FloatDistribution(float(dim.low), float(dim.high), log=dim.log, step=dim.step)


def build_distributions(spec: StudySpec, source: str) -> dict[str, BaseDistribution]:
    """Distributions keyed by dotted field name; raises ConfigError naming `source: space.FIELD`."""
    distributions = {}
    for name, dim in spec.space.items():
        try:
            kind, literal = field_kind(spec.base, name)
            distributions[name] = to_distribution(name, dim, kind, literal)
            for value in probe_values(distributions[name]):
                check_value(spec, {name: value})
        except ConfigError as error:
            raise ConfigError(f"{source}: space.{error}") from None
    return distributions


def probe_values(distribution: BaseDistribution) -> list[Any]:
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    if isinstance(distribution, IntDistribution):
        values = range(distribution.low, distribution.high + 1, distribution.step)
        return list(values) if len(values) <= MAX_CHECKED_INTS else [distribution.low, distribution.high]
    assert isinstance(distribution, FloatDistribution)
    return [distribution.low, distribution.high]


def check_value(spec: StudySpec, overrides: dict[str, Any]) -> RunConfig:
    """The run config with these overrides, validated by the schema and against the trial layout."""
    (name, value), *_ = overrides.items()
    try:
        config = parse_run_config(apply_overrides(spec.base, overrides), "override")
        check_fits(config, Layout(spec.layout.nproc // spec.layout.per_node, spec.layout.per_node))
    except ConfigError as error:
        detail = str(error).removeprefix("override: ").removeprefix(f"{name}: ")
        raise ConfigError(f"{name}: value {value!r} is invalid: {detail}") from None
    return config


def paper_default_params(spec: StudySpec, distributions: dict[str, BaseDistribution], source: str) -> dict[str, Any]:
    """The guideline for the fields the base method publishes one for (its settings' guideline), the base
    config's value for every other searched field."""
    base = RunConfig.model_validate(spec.base)
    settings = type(base.method)
    guideline = dict(zip(settings.keys(settings.guideline), settings.guideline.values(), strict=True))
    params = {}
    for name, distribution in distributions.items():
        value = guideline.get(name, _lookup(base, name))
        if not contains(distribution, value):
            origin = "the paper's guideline" if name in guideline else "the base config's value"
            raise ConfigError(
                f"{source}: space.{name}: {origin} {value!r} (the paper-defaults reference trial) lies outside "
                f"{_describe(distribution)}; widen the range or set references.paper_defaults: false"
            )
        params[name] = value
    return params


def _lookup(config: BaseModel, dotted: str) -> Any:
    value: Any = config
    for key in dotted.split("."):
        value = getattr(value, key)
    return list(value) if isinstance(value, tuple) else value


def _describe(distribution: BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return f"choices {list(distribution.choices)}"
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    return f"[{distribution.low}, {distribution.high}]"


def trial_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Optuna's params are already dotted run-config keys."""
    return dict(params)


def ddp_reference_config(spec: StudySpec) -> dict[str, Any]:
    """The base config with plain DDP in place of the method: the traffic yardstick of the study."""
    return {**spec.base, "method": {"name": "ddp"}}
