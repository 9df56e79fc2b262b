"""Launcher profiles: the typed YAML file behind each launcher (its `profile_type`; parsed in launchers.py).

`--launcher NAME|PATH`: a path to a YAML file, or a name looked up as `./launchers/NAME.yaml` (a
project's own profiles) and then among the shipped profiles (the checkout's top-level `launchers/`,
installed as the package data `abtune/launchers/`). Adding a shipped profile is adding a file. A profile is
validated once, when it is loaded (unknown keys, ranges), and again against the run it will start
(`check_fits`): AB's groups must not straddle nodes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from abtune.config import RunConfig, describe_validation_error
from abtune.errors import ConfigError
from abtune.launch.base import DEFAULT_LAUNCHER, Layout
from abtune.named_yaml import NamedFiles
from abtune.schema import StrictModel

PROFILES = NamedFiles("launchers")
BUILTIN_DIR = PROFILES.shipped


def parse_rate_bits(text: str) -> float:
    """tc's rate syntax (`1gbit`, `100mbit`, `500kbit`, `10mbps` = bytes) in bits per second."""
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0,
             "tbps": 8e12, "gbps": 8e9, "mbps": 8e6, "kbps": 8e3, "bps": 8.0}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            try:
                return float(lowered[: -len(unit)]) * factor
            except ValueError:
                break
    raise ValueError(f"expected a rate such as 1gbit, 100mbit or 500kbit, got {text!r}")


class FabricFault(StrictModel):
    """A change to one node's link once the run has reached `at_step` (as rank 0's log records say, every
    `train.log_every` steps): the link down or up again, or its loss and one-way latency from then on."""

    at_step: int = Field(ge=1)
    node: int = Field(0, ge=0, description="the simulated node whose link changes")
    link: Literal["down", "up"] | None = None
    loss_pct: float | None = Field(None, ge=0, lt=100)
    latency_ms: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _changes_something(self) -> FabricFault:
        if self.link is None and self.loss_pct is None and self.latency_ms is None:
            raise ValueError("a fault changes something: give link (down|up), loss_pct or latency_ms")
        return self


class FabricProfile(StrictModel):
    """An emulated interconnect between the simulated nodes (`abtune/launch/fabric.py`): each node in a
    network namespace of its own, joined by links shaped with `tc`. Needs root (or CAP_NET_ADMIN) and iproute2."""

    bandwidth: str | None = Field(None, description="each node's link rate in tc's units (1gbit, 100mbit); "
                                                    "null: unshaped")
    latency_ms: float = Field(0.0, ge=0, description="one-way delay between two nodes")
    loss_pct: float = Field(0.0, ge=0, lt=100, description="share of the packets reaching each node that are "
                            "lost (an iptables rule in the node's namespace)")
    faults: tuple[FabricFault, ...] = Field((), description="changes to a node's link at a given step (tests, drills)")

    @field_validator("bandwidth")
    @classmethod
    def _a_rate(cls, value: str | None) -> str | None:
        if value is not None and parse_rate_bits(value) <= 0:
            raise ValueError(f"expected a positive rate, got {value!r}")
        return value

    @property
    def loses_packets(self) -> bool:
        """From the start or after a fault (iptables is needed)."""
        return self.loss_pct > 0 or any(f.loss_pct is not None for f in self.faults)


class LocalProfile(StrictModel):
    """Ranks as processes on this machine (`--nproc`, `--ranks-per-node` simulate nodes); with `fabric`,
    the simulated nodes talk over an emulated, shaped network instead of the loopback."""

    kind: Literal["local"] = "local"
    fabric: FabricProfile | None = None


class DebugProfile(StrictModel):
    """One rank inside the `abtune` process itself, so breakpoints and debuggers work."""

    kind: Literal["debug"] = "debug"


def resolve_profile_path(name_or_path: str) -> Path:
    """A path if it looks like one (or exists), else ./launchers/NAME.yaml, else the shipped NAME.yaml."""
    found = PROFILES.find(name_or_path)
    if found is not None:
        return found
    raise ConfigError(f"--launcher {name_or_path}: no such profile; choose one of {', '.join(profile_names())} "
                      "or give the path of a YAML file")


def add_launcher_argument(parser: argparse.ArgumentParser, help: str, default: str = DEFAULT_LAUNCHER) -> None:
    """The `--launcher NAME|PATH` option of a command that starts runs (`resolve_profile_path` reads it)."""
    parser.add_argument("--launcher", default=default, metavar="NAME|PATH", help=help)


def profile_names() -> list[str]:
    return PROFILES.names()


def validate_profile(schema: type[StrictModel], raw: dict[str, Any], source: str) -> StrictModel:
    """A profile of the launcher whose schema is `schema` (launchers.parse_profile picks it by `kind`)."""
    try:
        return schema.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_with_valid_keys(error, source, schema, raw["kind"])) from None


def _with_valid_keys(error: ValidationError, source: str, schema: type[BaseModel], kind: str) -> str:
    """describe_validation_error, each unknown key answered with the keys of the section it sits in."""
    lines = describe_validation_error(error, source).splitlines()
    hint = "(check the spelling; see `abtune config show` for valid keys)"
    for index, item in enumerate(error.errors()):
        if item["type"] == "extra_forbidden":
            section = _section(schema, item["loc"][:-1])
            if section is None:
                continue
            where = f"a {kind} profile" if len(item["loc"]) == 1 else f"{'.'.join(map(str, item['loc'][:-1]))}"
            lines[index] = lines[index].replace(hint, f"(valid keys of {where}: {', '.join(section.model_fields)})")
    return "\n".join(lines)


def _section(schema: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the section at `loc` (names of fields, indices of their tuple items); None: not a model."""
    section: type[BaseModel] | None = schema
    for key in loc:
        if isinstance(key, int) or section is None:
            continue  # an item of a tuple of sections: the same model
        annotation = section.model_fields[key].annotation
        section = next((t for t in (annotation, *_arguments(annotation))
                        if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return section


def _arguments(annotation: object) -> tuple[object, ...]:
    """The types inside `X | None` and `tuple[X, ...]`, one level deep."""
    return tuple(a for arg in get_args(annotation) for a in (arg, *get_args(arg)))


def check_fits(config: RunConfig, layout: Layout) -> None:
    """Problems of this run on this layout, found before anything is submitted: AB's groups, and the cluster
    whose time it predicts (`train.cluster`), which rank 0 would refuse only after the start-up."""
    config.method.check_layout(layout.world_size, layout.ranks_per_node, layout.nodes)
    if config.train.cluster is not None:
        from abtune.timing import check_fits as fits_cluster
        from abtune.timing import load_cluster

        fits_cluster(layout.nodes, layout.ranks_per_node, load_cluster(config.train.cluster))
