"""Scaling targets: where promoted configurations go (model, data, epochs, batch sizes, node shape).

A target holds a run config without the numbers that depend on the scale (`train.steps`,
`train.local_batch_size`): the planner computes those per node count and strategy. It is
validated once when loaded; the data folder is checked separately, before anything is submitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from abtune.config import apply_overrides, describe_validation_error, parse_run_config
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS
from abtune.schema import StrictModel
from abtune.yamlfile import read_yaml

PLANNED_KEYS = ("steps", "local_batch_size")  # train.* fields the planner sets per run
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's
UNSET_ROOT = Path("DATA_ROOT_NOT_SET")  # stands in for a missing data.root under --dry-run only


class ScalingConfig(StrictModel):
    """How the target scales; the paper's values are in studies/imagenet_*.yaml."""

    epochs: int = Field(ge=1, description="passes over the training set; steps = epochs x samples // global batch")
    local_batch_size: int = Field(ge=1, description="samples per rank under --scaling local (paper: 256)")
    global_batch_size: int = Field(ge=1, description="samples per step under --scaling global (paper: 4096)")
    ranks_per_node: int = Field(ge=1, description="ranks (GPUs) per node (paper: 4)")
    train_samples: int | None = Field(
        None, ge=1, description="training images (ImageNet-2012: 1,281,167); null counts data.root/train"
    )


class ScalingTarget(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    run: dict[str, Any] = Field(description="a run config without train.steps and train.local_batch_size")
    scaling: ScalingConfig


def load_target(path: Path, data_root: Path | None = None, ranks_per_node: int | None = None) -> ScalingTarget:
    """Read and validate TARGET; `data_root` and `ranks_per_node` override the file's values."""
    raw = read_yaml(path)
    if data_root is not None:
        raw = apply_overrides(raw, {"run.data.root": str(data_root)})
    if ranks_per_node is not None:
        raw = apply_overrides(raw, {"scaling.ranks_per_node": ranks_per_node})
    try:
        target = ScalingTarget.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, str(path))) from None
    _check_run_section(target, str(path))
    return target


def _check_run_section(target: ScalingTarget, source: str) -> None:
    planned = [f"train.{k}" for k in PLANNED_KEYS if k in target.run.get("train", {})]
    if planned:
        raise ConfigError(f"{source}: run.{planned[0]} is computed per node count; remove it "
                          "(set scaling.epochs and the batch sizes instead)")
    config = parse_run_config(with_root(target.run), source=f"{source}: run")
    if not config.method.promoted_fields:
        promotable = [name for name, cls in METHOD_CONFIGS.items() if cls.promoted_fields]
        raise ConfigError(f"{source}: run.method.name: promoted configurations are AB runs; "
                          f"choose one of {', '.join(promotable)} (got {config.method.name!r})")


def with_root(run: dict[str, Any]) -> dict[str, Any]:
    """`run` with a placeholder data.root when none is set, so it validates for planning."""
    if run.get("data", {}).get("root") is not None or run.get("data", {}).get("name", "digits") == "digits":
        return run
    return apply_overrides(run, {"data.root": str(UNSET_ROOT)})


def data_root(target: ScalingTarget) -> Path | None:
    root = target.run.get("data", {}).get("root")
    return None if root is None else Path(root).expanduser()


def check_data_root(target: ScalingTarget, source: str) -> None:
    """The data folder exists with train/ and val/; one clear line otherwise."""
    if target.run.get("data", {}).get("name", "digits") == "digits":
        return
    root = data_root(target)
    where = "set run.data.root in " + source + " or pass --data-root"
    if root is None:
        raise ConfigError(f"data.root: not set; {where} (a folder with train/<class>/*.JPEG and val/<class>/*.JPEG)")
    missing = [p for p in (root, root / "train", root / "val") if not p.is_dir()]
    if missing:
        raise ConfigError(f"data.root: {missing[0]} does not exist; {where} (expected root/train/<class>/ "
                          "and root/val/<class>/)")


def train_samples(target: ScalingTarget) -> int:
    """The target's stated training-set size, else the images counted under data.root/train."""
    if target.scaling.train_samples is not None:
        return target.scaling.train_samples
    root = data_root(target)
    if root is None or not (root / "train").is_dir():
        raise ConfigError("scaling.train_samples: not set and data.root/train cannot be counted; "
                          "set scaling.train_samples or run.data.root (--data-root)")
    count = sum(1 for p in (root / "train").glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if count == 0:
        raise ConfigError(f"data.root: {root / 'train'} holds no images in class folders")
    return count
