"""The run configuration: one typed tree, validated once when it is loaded.

Every section forbids unknown keys, so a typo fails before any process starts, with the YAML path
of the bad field in the message. `flatten()` turns the resolved tree into the flat dict that
trackers record as parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from abtune.errors import ConfigError
from abtune.phases import Phase
from abtune.yamlfile import read_yaml

Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
TRUNC_NORMAL_STD = 0.02  # timm's ViTs and the original ViT/BERT code


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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


class MethodSettings(StrictModel):
    """The base of every method's config: what the layers above `abtune/methods/` may ask of a method
    without naming it. Torch-free, so the CLI and the study ask it without importing the method."""

    promotable: ClassVar[bool] = False  # its searched fields carry into a scaling campaign (abtune promote)
    has_paper_defaults: ClassVar[bool] = False  # a study's paper-defaults reference trial applies to it

    def check_layout(self, world_size: int, ranks_per_node: int, nodes: int) -> None:
        """Refuse (ConfigError) a layout the method cannot run on, before anything is submitted."""

    def phase_schedule(self, total_steps: int) -> ABSchedule | None:
        """The method's phases in absolute steps; None: one phase, `train`, for the whole run."""
        return None

    def derived_params(self, total_steps: int, ranks_per_node: int) -> dict[str, Any]:
        """Values the method derives from its fields and the layout, recorded beside them by the trackers."""
        return {}


class DdpConfig(MethodSettings):
    """Traditional full-rank data parallelism (PyTorch DDP)."""

    name: Literal["ddp"] = "ddp"
    comm_hook: Literal["allreduce", "noop"] = Field(
        "allreduce",
        description="noop skips the gradient exchange: the zero-communication floor for benchmarks (ranks drift apart)",
    )


class AbConfig(MethodSettings):
    """AB-training. Step counts are fractions so a configuration transfers between step budgets;
    the defaults are the paper's guideline (section 4.3)."""

    name: Literal["ab", "ab-nogroups"] = "ab"
    warmup_frac: float = Field(0.20, ge=0.0, lt=1.0, description="full-rank warmup, fraction of all steps")
    ab_frac: Fraction = Field(1 / 30, description="numABSteps as a fraction of all steps")
    rebound_frac: float = Field(0.25, ge=0.0, le=10.0, description="fullRankReboundSteps / numABSteps")
    lr_rebound_frac: float = Field(0.5, ge=0.0, le=10.0, description="LR rebound steps / numABSteps")
    sigma_cutoff: Fraction = Field(0.1, description="keep singular values > cutoff * largest")
    rank_cap: float | None = Field(
        1.0, gt=0.0, le=1.0,
        description="factor a weight (m x n, rank r) only if its factors hold at most this fraction of its "
                    "entries, r(m+n) <= rank_cap * mn, and never at r(m+n) >= mn; else it stays full rank "
                    "during the AB phase. null: factor every eligible weight whatever r",
    )
    lr_rebound_floor: float = Field(
        1e-5, ge=0.0, description="learning rate of the first step after a change of shape (the authors' code: 1e-5)"
    )
    group_size: int | None = Field(None, ge=1, description="ranks per independent group; default ranks per node")
    sync_mode: Literal["with-stale", "only-learned", "full"] = "with-stale"
    keep_full_rank: tuple[str, ...] = Field(
        (), description="extra module-name globs kept full rank (head and first layer always are)"
    )

    promotable: ClassVar[bool] = True
    has_paper_defaults: ClassVar[bool] = True

    @property
    def grouped(self) -> bool:
        """`ab` trains A and B in independent groups; `ab-nogroups` (the paper's "No Group") over all ranks."""
        return self.name == "ab"

    def check_layout(self, world_size: int, ranks_per_node: int, nodes: int) -> None:
        if not self.grouped:
            return
        size = self.resolved_group_size(world_size, ranks_per_node, nodes)
        if nodes > 1 and size % ranks_per_node and ranks_per_node % size:
            raise ConfigError(
                f"method.group_size {size} and tasks_per_node {ranks_per_node}: AB's groups would straddle "
                f"nodes; choose ranks per node dividing {size} (or a group size dividing {ranks_per_node})"
            )

    def resolved_group_size(self, world_size: int, ranks_per_node: int, num_nodes: int) -> int:
        """Ranks per independent group. Default: one group per node; on a single node, two groups of half the ranks."""
        if self.group_size is not None:
            size = self.group_size
        elif num_nodes > 1:
            size = ranks_per_node
        else:
            size = max(1, world_size // 2)
        _check_groups(size, world_size)
        return size

    def phase_schedule(self, total_steps: int) -> ABSchedule:
        return ABSchedule.from_config(self, total_steps)

    def derived_params(self, total_steps: int, ranks_per_node: int) -> dict[str, Any]:
        steps = self.phase_schedule(total_steps).describe()
        params: dict[str, Any] = {f"method.{k}": v for k, v in steps.items() if k != "total_steps"}
        if self.grouped:
            params["group_size"] = self.group_size or ranks_per_node
        return params


def _check_groups(size: int, world_size: int) -> None:
    """AB gives half of the groups A and half B: at least two groups, an even number, of equal size."""
    if world_size < 2:
        raise ConfigError("method ab needs at least 2 ranks (one A group and one B group); use --nproc 2 or more, or method ab-nogroups")
    if world_size % size:
        raise ConfigError(f"method.group_size: {size} does not divide the {world_size} ranks; choose a divisor of {world_size}")
    if world_size // size < 2:
        raise ConfigError(
            f"method.group_size: {size} leaves a single group of {world_size} ranks; AB-training needs at least "
            f"2 groups (one trains A, one trains B): choose at most {world_size // 2}"
        )
    if (world_size // size) % 2:
        even = [d for d in range(1, world_size // 2 + 1) if world_size % d == 0 and (world_size // d) % 2 == 0]
        raise ConfigError(
            f"method.group_size: {size} makes {world_size // size} groups of the {world_size} ranks (default: one "
            f"group per node); AB-training "
            f"gives half of the groups A and half B, so it needs an even number: choose one of "
            f"{', '.join(map(str, even)) or '(none: use an even number of ranks)'}"
        )


# --- AB-training's phase schedule, turned from fractions into absolute steps once -----------------
# warmup (full-rank DDP) | AB | rebound | AB | rebound | ... until the step budget is spent.
# A change of shape happens at the start of every AB segment (decompose) and at the end of every
# AB segment (sync and rebuild W = A.B); the learning rate rebounds after each, from a floor near zero.
# It lives beside AbConfig (not in methods/ab/) so the study, promote and the trackers read it without torch.


AB_PHASES = (Phase.WARMUP, Phase.AB, Phase.REBOUND)  # the phases of AB's segments


def round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


@dataclass(frozen=True)
class Segment:
    phase: Phase
    start: int
    end: int  # exclusive


@dataclass(frozen=True)
class ABSchedule:
    total_steps: int
    warmup_steps: int
    ab_steps: int
    rebound_steps: int
    lr_rebound_steps: int
    lr_floor: float
    segments: tuple[Segment, ...]

    @classmethod
    def from_config(cls, config: AbConfig, total_steps: int) -> ABSchedule:
        warmup = min(total_steps, round_half_up(config.warmup_frac * total_steps))
        ab = max(1, round_half_up(config.ab_frac * total_steps))
        rebound = round_half_up(config.rebound_frac * ab)
        lr_rebound = round_half_up(config.lr_rebound_frac * ab)
        return cls(total_steps, warmup, ab, rebound, lr_rebound, config.lr_rebound_floor,
                   _segments(total_steps, warmup, ab, rebound))

    def segment_at(self, step: int) -> Segment:
        for segment in self.segments:
            if segment.start <= step < segment.end:
                return segment
        raise IndexError(f"step {step} outside the schedule of {self.total_steps} steps")

    def phase_at(self, step: int) -> Phase:
        return self.segment_at(step).phase

    def steps_by_phase(self, steps_done: int) -> dict[Phase, int]:
        """How many of the first `steps_done` steps each phase had."""
        done = dict.fromkeys(AB_PHASES, 0)
        for segment in self.segments:
            done[segment.phase] += max(0, min(segment.end, steps_done) - segment.start)
        return done

    def syncs_done(self, steps_done: int) -> int:
        """AB phases whose factors had been averaged once `steps_done` steps had run: an AB phase that
        ends at step e (exclusive) syncs as step e begins, or as the run finishes when e ends the run."""
        return sum(1 for s in self.segments if s.phase is Phase.AB
                   and (s.end < steps_done or s.end == steps_done == self.total_steps))

    def shape_change_steps(self) -> list[int]:
        """Steps before which the parameters change shape: every AB start and every AB end inside the run."""
        changes = []
        for segment in self.segments:
            if segment.phase is Phase.AB:
                changes.append(segment.start)
                if segment.end < self.total_steps:
                    changes.append(segment.end)
        return changes

    def learning_rate(self, step: int, scheduled: float) -> float:
        """`scheduled`, except in the LR rebound after a change of shape: a linear ramp from the floor
        (the first step after the change) up to `scheduled` (reached the step after the rebound ends)."""
        last_change = max((s for s in self.shape_change_steps() if s <= step), default=None)
        if last_change is None or step - last_change >= self.lr_rebound_steps:
            return scheduled
        start = min(self.lr_floor, scheduled)
        return start + (scheduled - start) * (step - last_change) / self.lr_rebound_steps

    def describe(self) -> dict[str, int]:
        return {
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "ab_steps": self.ab_steps,
            "rebound_steps": self.rebound_steps,
            "lr_rebound_steps": self.lr_rebound_steps,
            "ab_cycles": sum(1 for s in self.segments if s.phase is Phase.AB),
        }


def _segments(total: int, warmup: int, ab: int, rebound: int) -> tuple[Segment, ...]:
    segments = [Segment(Phase.WARMUP, 0, warmup)] if warmup else []
    cursor = warmup
    while cursor < total:
        for phase, length in ((Phase.AB, ab), (Phase.REBOUND, rebound)):
            end = min(total, cursor + length)
            if end > cursor:
                segments.append(Segment(phase, cursor, end))
            cursor = end
    return tuple(segments)


class SbcConfig(MethodSettings):
    """Sparse Binary Compression (Sattler et al. 2018): communication delay, top-k sparsification,
    binarization, Golomb-coded positions, error feedback."""

    name: Literal["sbc"] = "sbc"
    delay: int = Field(10, ge=1, description="local optimizer steps between exchanges of the accumulated update")
    sparsity: float = Field(0.01, gt=0.0, le=1.0, description="fraction of each tensor's entries sent (per side)")
    binarize: bool = Field(True, description="send one mean per tensor instead of the kept values")


class PowerSgdConfig(MethodSettings):
    """PyTorch's PowerSGD DDP comm hook (Vogels et al. 2019): rank-r gradient approximations."""

    name: Literal["powersgd"] = "powersgd"
    rank: int = Field(2, ge=1, description="matrix approximation rank")
    start_step: int = Field(10, ge=2, description="plain all-reduce before this step (PyTorch needs > 1)")
    min_compression_rate: float = Field(2.0, ge=1.0, description="compress a matrix only if it shrinks this much")
    error_feedback: bool = True
    warm_start: bool = True


class Fp16Config(MethodSettings):
    """PyTorch's fp16 compression DDP comm hook: gradients all-reduced in half precision."""

    name: Literal["fp16"] = "fp16"


MethodConfig = Annotated[
    DdpConfig | AbConfig | SbcConfig | PowerSgdConfig | Fp16Config, Field(discriminator="name")
]

# Every method's config class by the names it answers to, read off MethodConfig so a new method needs no list edited.
METHOD_CONFIGS: dict[str, type[MethodSettings]] = {
    name: cls
    for cls in get_args(get_args(MethodConfig)[0])
    for name in get_args(cls.model_fields["name"].annotation)
}


class RunConfig(StrictModel):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    method: MethodConfig = Field(default_factory=DdpConfig)


def _format_location(loc: tuple[int | str, ...]) -> str:
    # Pydantic puts the discriminator's tag into the path (method.ab.sigma_cutoff); the user wrote method.sigma_cutoff.
    parts = [str(p) for p in loc if p not in METHOD_CONFIGS]
    return ".".join(parts) or "(top level)"


def describe_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem: `source: path.to.field: what is wrong (got value)`."""
    lines = []
    for item in error.errors():
        where = _format_location(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see `abtune config show` for valid keys)"
        shown = item["type"] not in ("extra_forbidden", "missing") and not isinstance(item["input"], dict)
        got = f" (got {item['input']!r})" if shown else ""  # a whole section is too long to repeat
        lines.append(f"{source}: {where}: {message}{got}")
    return "\n".join(lines)


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
    result = yaml.safe_load(yaml.safe_dump(raw))  # deep copy of plain data
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
