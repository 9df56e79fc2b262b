"""The base of every typed section of abtune's files: run configs, method settings, study files, launcher
profiles. A leaf: the configuration and each method's settings stand on it."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]


class StrictModel(BaseModel):
    """Unknown keys refused (a typo fails before any process starts), values frozen, defaults validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def validation_lines(error: ValidationError, source: str, hidden_tags: Collection[str] = ()) -> str:
    """Every problem, one line each: `source: path.to.field: what is wrong (got value)`. `hidden_tags`:
    discriminator tags Pydantic puts into a path that the user never wrote (`method.ab.x` is `method.x`)."""
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"] if p not in hidden_tags) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see `abtune config show` for valid keys)"
        shown = item["type"] not in ("extra_forbidden", "missing") and not isinstance(item["input"], dict)
        got = f" (got {item['input']!r})" if shown else ""  # a whole section is too long to repeat
        lines.append(f"{source}: {where}: {message}{got}")
    return "\n".join(lines)
