"""The run configuration: one typed tree, validated once when it is loaded.

Every section forbids unknown keys, so a typo fails before any process starts, with the YAML path
of the bad field in the message. The `method:` section is the settings of the method it names, which
live beside each method (abtune/methods/). `flatten()` turns the resolved tree into the flat dict
that trackers record as parameters.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS, MethodConfig
from abtune.methods.ddp.settings import DdpConfig
from abtune.schema import Fraction, StrictModel, validation_lines
from abtune.yamlfile import read_yaml

TRUNC_NORMAL_STD = 0.02  # timm's ViTs and the original ViT/BERT code


class ModelConfig(StrictModel):
    """The network. `vit` is torchvision's VisionTransformer with the sizes below (default: the
    paper's mini ViT: patch 8, depth 6, 6 heads, hidden 768, MLP 3072); the other names are
    torchvision's reference models."""

    arch: Literal["vit", "vit_b_16", "resnet18", "resnet50", "vgg16", "small_cnn"] = "vit"
    patch_size: int = Field(8, ge=1)
    num_layers: int = Field(6, ge=1)
    num_heads: int = Field(6, ge=1)
    hidden_dim: int = Field(768, ge=1)
    mlp_dim: int = Field(3072, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    init: Literal["default", "orthogonal", "trunc_normal"] = Field(
        "default",
        description="default: torchvision's; orthogonal: every Linear/Conv weight (the paper); trunc_normal: "
                    "every Linear weight and attention projection from a normal truncated at 2 std, biases zero "
                    "(timm's ViTs, std 0.02)",
    )
    init_std: float | None = Field(
        None, gt=0.0, le=1.0, description="standard deviation of init: trunc_normal (default 0.02)"
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelConfig:
        if self.arch == "vit" and self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim ({self.hidden_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        return self

    @model_validator(mode="after")
    def _std_only_for_trunc_normal(self) -> ModelConfig:
        if self.init_std is not None and self.init != "trunc_normal":
            raise ValueError(f"init_std is the std of init: trunc_normal; with init: {self.init} remove it")
        return self

    @property
    def trunc_normal_std(self) -> float:
        return TRUNC_NORMAL_STD if self.init_std is None else self.init_std


class DataConfig(StrictModel):
    """The data set. `digits` is scikit-learn's offline digits (8x8, 10 classes) for quick runs;
    CIFAR is read by torchvision (downloaded into `root` when `download` is true); ImageNet is a
    folder tree `root/train/<class>/*.JPEG`, `root/val/<class>/*.JPEG`."""

    name: Literal["digits", "cifar10", "cifar100", "imagenet"] = "digits"
    root: Path | None = None
    download: bool = False
    verify_checksums: bool = True
    image_size: int | None = Field(None, ge=1, description="resize/crop size; default per data set")
    augment: bool = True
    num_workers: int = Field(0, ge=0)
    val_fraction: Fraction = 0.2

    @model_validator(mode="after")
    def _root_where_needed(self) -> DataConfig:
        if self.name != "digits" and self.root is None:
            raise ValueError(f"data set '{self.name}' needs data.root: the folder that holds (or will hold) it")
        return self


class HangConfig(StrictModel):
    """When a rank that makes no progress ends its run (abtune/training/hang.py)."""

    enabled: bool = True
    factor: float = Field(10.0, gt=1.0, description="hung when a step, evaluation or checkpoint runs this many "
                          "times longer than the longest of its kind so far")
    floor_s: float = Field(120.0, gt=0.0, description="never hung sooner than this many seconds")
    untimed_s: float = Field(900.0, gt=0.0, description="the bound for work with no time of its kind yet: set-up, "
                             "the first step, evaluation and checkpoint, and the end of the run")

    @model_validator(mode="after")
    def _untimed_not_below_floor(self) -> HangConfig:
        if self.untimed_s < self.floor_s:
            raise ValueError(f"untimed_s ({self.untimed_s:g}) must be at least floor_s ({self.floor_s:g})")
        return self


class TrainConfig(StrictModel):
    steps: int = Field(300, ge=1, description="optimizer steps in the whole run")
    local_batch_size: int = Field(32, ge=1, description="samples per rank per step")
    eval_every: int | None = Field(None, ge=1, description="steps between evaluations; default once per epoch")
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0 writes only the final one")
    keep_checkpoints: int = Field(2, ge=1)
    grad_clip: float | None = Field(None, gt=0.0)
    pg_timeout_s: int = Field(600, ge=10, description="seconds a collective may wait before the run fails")
    hang: HangConfig = Field(default_factory=HangConfig, description="a rank without progress ends the run sooner")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="forward passes under autocast; bf16 is recommended on Ampere and newer GPUs"
    )
    loss_scale: float = Field(2.0**16, gt=0.0, description="fp16 only: the gradient scaler's initial loss scale")
    target_top1: float | None = Field(None, gt=0.0, le=1.0, description="report the training seconds until the "
                                      "first evaluation at or above this top-1 (time_to_target)")
    cluster: str | None = Field(None, description="predict the run's time on this cluster (a name in clusters/ "
                                "or a YAML path; abtune/timing.py): the summary's `predicted`")

    @model_validator(mode="after")
    def _cluster_exists(self) -> TrainConfig:
        if self.cluster is not None:
            from abtune.timing import load_cluster  # only when named: keeps config light for every import

            try:
                load_cluster(self.cluster)
            except ConfigError as error:
                raise ValueError(str(error)) from None
        return self


class OptimizerConfig(StrictModel):
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.05, ge=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD only")
    betas: tuple[float, float] = (0.9, 0.999)


class ScheduleConfig(StrictModel):
    """The base learning-rate schedule; AB's LR rebound replaces it for a few steps after each change of shape."""

    name: Literal["cosine", "constant"] = "cosine"
    warmup_frac: float = Field(0.05, ge=0.0, lt=1.0, description="linear LR warmup, fraction of steps")
    min_lr_frac: float = Field(0.0, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")


class RunConfig(StrictModel):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    method: MethodConfig = Field(default_factory=DdpConfig)


def describe_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem: `source: path.to.field: what is wrong (got value)`; a method's name, which
    Pydantic puts into the path as the discriminator's tag, left out (the user wrote `method.FIELD`)."""
    return validation_lines(error, source, hidden_tags=METHOD_CONFIGS)


def parse_run_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None


def load_run_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    raw = read_yaml(path)
    if overrides:
        raw = apply_overrides(raw, overrides)
    return parse_run_config(raw, str(path))


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of `raw` with dotted keys (`method.sigma_cutoff`) set."""
    result = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        node = result
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {dotted}: {key} is not a section (it holds {child!r})")
            node = child
        node[leaf] = value
    return result


def flatten(config: BaseModel | dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The resolved tree as `{"method.sigma_cutoff": 0.1, ...}` with plain values."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
