"""A scaling campaign: one run per (node count x configuration), with its step counts recomputed.

Strategies (the paper's sections 4.4 and 4.5):
* `local`: constant local batch. The global batch grows with the ranks, so steps per epoch shrink.
* `global`: constant global batch. The local batch shrinks with the ranks and must divide evenly.
Steps = epochs x (training samples // global batch), the count the data loader yields (it drops
partial batches); AB's warmup/AB/rebound steps follow from the carried fractions (the method config's phase schedule).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from abtune.config import RunConfig, apply_overrides, parse_run_config
from abtune.errors import ConfigError
from abtune.promote.select import Promoted
from abtune.promote.target import ScalingTarget, with_root
from abtune.schema import StrictModel
from abtune.words import plural

Strategy = Literal["local", "global"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
BASELINE = "ddp"
CAMPAIGN_FILE = "campaign.yaml"


class PromotedFrom(StrictModel):
    study: str
    trial: int
    values: tuple[float, ...] = ()
    mlflow_run_id: str | None = None
    confirmed: str | None = None


class PlannedRun(StrictModel):
    name: str
    configuration: str  # "ddp" for the baseline, else the promoted configuration's name
    method: str
    precision: str = "fp32"
    nodes: int
    ranks_per_node: int
    world_size: int
    local_batch_size: int
    global_batch_size: int
    steps_per_epoch: int
    steps: int
    schedule: dict[str, int] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    promoted_from: PromotedFrom | None = None
    run_dir: str


class Campaign(StrictModel):
    target: str
    target_file: str
    study: str | None = None
    strategy: Strategy
    nodes: tuple[int, ...]
    epochs: int
    train_samples: int
    runs: tuple[PlannedRun, ...]


def parse_nodes(text: str) -> tuple[int, ...]:
    try:
        nodes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--nodes {text!r}: expected comma-separated node counts, e.g. 2,4,8,16,32") from None
    if not nodes or min(nodes) < 1 or len(set(nodes)) != len(nodes):
        raise ConfigError(f"--nodes {text!r}: expected distinct node counts of at least 1, e.g. 2,4,8,16,32")
    return nodes


def batch_sizes(target: ScalingTarget, strategy: Strategy, world_size: int) -> tuple[int, int]:
    """(local, global) batch size for `world_size` ranks."""
    scaling = target.scaling
    if strategy == "local":
        return scaling.local_batch_size, scaling.local_batch_size * world_size
    if scaling.global_batch_size % world_size:
        raise ConfigError(f"--scaling global: the global batch {scaling.global_batch_size} does not divide evenly "
                          f"over {world_size} ranks; choose node counts whose rank count divides it")
    return scaling.global_batch_size // world_size, scaling.global_batch_size


def plan_campaign(target: ScalingTarget, target_file: str, promoted: list[Promoted], nodes: tuple[int, ...],
                  strategy: Strategy, samples: int, study: str | None = None) -> tuple[Campaign, dict[str, RunConfig]]:
    """The campaign (what campaign.yaml holds) and each run's resolved config, by run name."""
    runs, configs = [], {}
    for count in nodes:
        for item in [None, *promoted]:
            run, config = plan_run(target, item, count, strategy, samples)
            runs.append(run)
            configs[run.name] = config
    campaign = Campaign(target=target.name, target_file=target_file, study=study, strategy=strategy,
                        nodes=nodes, epochs=target.scaling.epochs, train_samples=samples, runs=tuple(runs))
    return campaign, configs


def plan_run(target: ScalingTarget, item: Promoted | None, nodes: int, strategy: Strategy,
             samples: int) -> tuple[PlannedRun, RunConfig]:
    rpn = target.scaling.ranks_per_node
    world = nodes * rpn
    local, global_ = batch_sizes(target, strategy, world)
    per_epoch = samples // global_
    if per_epoch == 0:
        raise ConfigError(f"{plural(nodes, 'node')}: a global batch of {global_} is more than the {samples} training "
                          "samples; use fewer nodes or smaller batches")
    steps = target.scaling.epochs * per_epoch
    label = BASELINE if item is None else item.name
    config = _run_config(target, item, f"{target.name}-{label}-n{nodes}", steps, local)
    schedule = _schedule(config, steps, world, rpn, nodes)
    source = None if item is None or item.source is None else PromotedFrom(
        study=item.source.study, trial=item.source.trial, values=item.source.values,
        mlflow_run_id=item.source.mlflow_run_id, confirmed=item.source.confirmed)
    run = PlannedRun(name=f"n{nodes:02d}-{label}", configuration=label, method=config.method.name,
                     precision=config.train.precision, nodes=nodes,
                     ranks_per_node=rpn, world_size=world, local_batch_size=local, global_batch_size=global_,
                     steps_per_epoch=per_epoch, steps=steps, schedule=schedule,
                     overrides={} if item is None else dict(item.overrides), promoted_from=source,
                     run_dir=f"runs/n{nodes:02d}-{label}")
    return run, config


def _run_config(target: ScalingTarget, item: Promoted | None, name: str, steps: int, local: int) -> RunConfig:
    raw = apply_overrides(with_root(target.run), {"name": name, "train.steps": steps, "train.local_batch_size": local})
    if item is None:
        raw["method"] = {"name": BASELINE}
    else:
        raw = apply_overrides(raw, item.overrides)
    return parse_run_config(raw, source=f"{name}")


def _schedule(config: RunConfig, steps: int, world: int, rpn: int, nodes: int) -> dict[str, int] | None:
    """The method's phases in steps; a layout the method cannot run on fails before anything is submitted."""
    try:
        config.method.check_layout(world, rpn, nodes)
    except ConfigError as error:
        raise ConfigError(f"{nodes} node(s) x {rpn} ranks: {error}") from None
    schedule = config.method.phase_schedule(steps)
    return None if schedule is None else schedule.describe()
