"""The study file: one typed tree, validated once, before anything touches the storage.

A study file names a base run config (inline or `base: run.yaml`), the layout of every trial,
the search space, the objectives, sampler, pruner, trial budget and retries. `load_study_spec`
resolves the base into a full RunConfig dump, so the stored definition is self-contained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from abtune.config import RunConfig, apply_overrides, describe_validation_error, parse_run_config
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS
from abtune.objectives import OBJECTIVES, ObjectiveName
from abtune.schema import StrictModel
from abtune.timing import check_fits, load_cluster
from abtune.yamlfile import read_yaml

SamplerName = Literal["tpe", "random", "nsgaii", "nsgaiii", "gp", "qmc", "cmaes"]
PrunerName = Literal["none", "median", "hyperband", "pareto-asha"]
CONSTRAINED_SAMPLERS = ("tpe", "nsgaii", "nsgaiii", "gp")

class Layout(StrictModel):
    nproc: int = Field(4, ge=1, description="ranks (processes) per trial")
    ranks_per_node: int | None = Field(None, ge=1, description="ranks per (simulated) node; default all")

    @model_validator(mode="after")
    def _divides(self) -> Layout:
        if self.nproc % self.per_node:
            raise ValueError(f"ranks_per_node {self.per_node} must divide nproc {self.nproc}")
        return self

    @property
    def per_node(self) -> int:
        return self.ranks_per_node or self.nproc

    @property
    def multi_node(self) -> bool:
        return self.nproc > self.per_node


class Dimension(StrictModel):
    """A range (`low`, `high`, optional `log` or `step`) or a list of `choices`; its type follows the field's."""

    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = Field(None, gt=0)
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _range_or_choices(self) -> Dimension:
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("give either choices or a range (low, high, log, step), not both")
            if not self.choices:
                raise ValueError("choices is empty: list at least two values")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a range needs both low and high (or give choices)")
        if self.low > self.high:
            raise ValueError(f"`low <= high` must hold, but got (low={self.low}, high={self.high})")
        if self.low == self.high:
            raise ValueError(f"empty range: low == high == {self.low}; fix the value in the base config instead")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range must be positive, but got low={self.low}; use a positive low or log: false")
        if self.log and self.step is not None:
            raise ValueError("step and log cannot be combined")
        return self


class SamplerSpec(StrictModel):
    name: SamplerName = "tpe"
    seed: int | None = 0
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the Optuna sampler")


class PrunerSpec(StrictModel):
    name: PrunerName = "none"
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the Optuna pruner")


class Constraints(StrictModel):
    max_inter_node_mb: float | None = Field(None, gt=0, description="traffic budget: inter-node MB per rank")


class References(StrictModel):
    paper_defaults: bool = Field(True, description="enqueue the paper's guideline configuration first")
    ddp: bool = Field(True, description="enqueue a plain-DDP reference run (outside the search space)")


class TrialHook(StrictModel):
    """A training hook every trial's rank 0 runs besides the study's own (abtune/training/hooks.py)."""
    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", description="module:callable returning a TrainingHook")
    options: dict[str, Any] = Field(default_factory=dict, description="its keyword arguments (plain values, never secrets)")
    may_stop: bool = Field(True, description="false: it never stops the run (no stop decision broadcast)")


class Retries(StrictModel):
    stale: int = Field(2, ge=0, description="re-runs of a trial whose worker died (crash, kill, lost node)")
    failed: int = Field(0, ge=0, description="re-runs of a trial whose training failed (NaN loss, dead rank)")
    hung: int = Field(1, ge=0, description="re-runs of a trial whose ranks stopped making progress (a dead link, "
                      "a frozen node; train.hang), from its checkpoint")
    stale_after_s: int = Field(120, ge=5, description="a trial of another host is stale after this heartbeat age")


class StudySpec(StrictModel):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    base: dict[str, Any] = Field(description="the run config every trial starts from (resolved)")
    layout: Layout = Layout()
    space: dict[str, Dimension] = Field(description="dotted run-config fields searched; default: the base method's "
                                        "default space (its settings' default_space)")
    objectives: list[ObjectiveName] = Field(default_factory=lambda: ["top1"], min_length=1)
    constraints: Constraints = Constraints()
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    references: References = References()
    trials: int = Field(20, ge=1, description="trial budget of the whole study, reference trials included")
    repeats: int = Field(1, ge=1, description="seeds per configuration; objectives are the means over them")
    retries: Retries = Retries()
    trial_timeout_min: int = Field(24 * 60, ge=1)
    hooks: list[TrialHook] = Field(default_factory=list, description="training hooks of every trial (and seed)")
    cluster: str | None = Field(None, description="the cluster whose predicted time trials report (clusters/NAME.yaml "
                                "or a path): sets base train.cluster, for the predicted_time_to_target objective")
    storage: str | None = Field(None, description="default storage for `study create`; --storage wins")
    study_dir: str | None = Field(None, description="folder of the trial runs; default runs/studies/NAME")

    @model_validator(mode="before")
    @classmethod
    def _method_default_space(cls, raw: Any) -> Any:
        """No `space:` searches what the base config's method declares searchable (its default_space; none:
        an empty space, which `study create` refuses)."""
        if not isinstance(raw, dict) or "space" in raw:
            return raw
        name = _dotted(raw.get("base") or {}, "method.name") or _default_method_name()
        settings = METHOD_CONFIGS.get(name) if isinstance(name, str) else None
        if settings is None:
            return raw  # the base's own validation names the problem
        return {**raw, "space": dict(zip(settings.keys(settings.default_space), settings.default_space.values(),
                                         strict=True))}

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[m].direction for m in self.objectives]

    def definition(self) -> dict[str, Any]:
        """What makes two studies the same: everything but where it is stored."""
        return self.model_dump(mode="json", exclude={"storage", "name"})


def load_study_spec(path: Path) -> StudySpec:
    raw = read_yaml(path)
    raw["base"] = _resolve_base(raw, path)
    raw.pop("overrides", None)
    if raw.get("cluster") is not None:
        raw["base"] = {**raw["base"], "train": {**raw["base"].get("train", {}), "cluster": raw["cluster"]}}
    spec = parse_study_spec(raw, str(path))
    if spec.cluster is not None:
        try:
            check_fits(spec.layout.nproc // spec.layout.per_node, spec.layout.per_node, load_cluster(spec.cluster))
        except ConfigError as error:
            raise ConfigError(f"{path}: cluster: {error}") from None
    return spec


def parse_study_spec(raw: dict[str, Any], source: str) -> StudySpec:
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None
    problem = _inconsistency(spec)
    if problem:
        raise ConfigError(f"{source}: {problem}")
    return spec


def _inconsistency(spec: StudySpec) -> str | None:
    """Rules that tie sections together; the message starts with the section to change."""
    if len(set(spec.objectives)) != len(spec.objectives) or "top1" not in spec.objectives:
        return f"objectives: must name top1 and no metric twice, got {spec.objectives}"
    if spec.multi_objective and spec.pruner.name not in ("none", "pareto-asha"):
        return (f"pruner: Optuna's {spec.pruner.name} pruner ranks one objective, and this study has "
                f"{len(spec.objectives)} ({', '.join(spec.objectives)}): set pruner: pareto-asha (or none)")
    if spec.constraints.max_inter_node_mb is not None and spec.sampler.name not in CONSTRAINED_SAMPLERS:
        return f"sampler: {spec.sampler.name} ignores constraints; use one of {', '.join(CONSTRAINED_SAMPLERS)}"
    for objective in (OBJECTIVES[m] for m in spec.objectives):
        for key in objective.needs_base_keys:
            if _dotted(spec.base, key) is None:
                hint = " (or `cluster: NAME` in the study file)" if key == "train.cluster" else ""
                return f"objectives: {objective.name} needs {key} in the base config{hint}"
    needs_nodes = any(OBJECTIVES[m].needs_multi_node for m in spec.objectives) \
        or spec.constraints.max_inter_node_mb is not None
    if needs_nodes and not spec.layout.multi_node:
        return "layout: inter-node traffic needs more than one node: set layout.ranks_per_node below nproc"
    return None


def _default_method_name() -> str:
    """The method of a run config that names none."""
    return RunConfig.model_fields["method"].get_default(call_default_factory=True).name


def _dotted(config: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _resolve_base(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """`base:` is a run config (a mapping) or a path relative to the study file; `overrides:` sets dotted keys."""
    base = raw.get("base")
    if base is None:
        raise ConfigError(f"{path}: base: missing: give the run config inline or as a path (base: run.yaml)")
    if isinstance(base, str):
        base_path = (path.parent / base).resolve()
        base = read_yaml(base_path)
        source = str(base_path)
    elif isinstance(base, dict):
        source = f"{path}: base"
    else:
        raise ConfigError(f"{path}: base: expected a mapping or a file path, got {type(base).__name__}")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{path}: overrides: expected a mapping of dotted keys, e.g. train.steps: 300")
    try:
        merged = apply_overrides(base, overrides)
    except ConfigError as error:
        raise ConfigError(f"{path}: overrides: {error}") from None
    try:
        config = parse_run_config(merged, source)
    except ConfigError:
        if not overrides or not _valid_alone(base):
            raise
        # the base is fine on its own: the fault is in the overrides, which live in the study file
        config = parse_run_config(merged, f"{path}: overrides")
    return config.model_dump(mode="json")


def _valid_alone(base: dict[str, Any]) -> bool:
    try:
        parse_run_config(base)
    except ConfigError:
        return False
    return True
