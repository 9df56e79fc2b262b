"""What a study will cost before it starts: its training time per trial and in all, where it will run.

On the local launcher (ranks as processes here) a short probe times the trial's model on this machine (one
thread, as a rank has); on a SLURM cluster the cluster description says (`--cluster NAME`,
clusters/NAME.yaml). The seconds come from abtune/timing.py (`estimate_run`); this module only gathers the
run's shape and words the answer. A local study estimated beyond a few hours is refused without `--yes`,
naming the SLURM route (docs/first-slurm-study.md). The probe's result is kept in the study (`study create`
probes, `study run` on the same host reads it): a runner then needs neither torch nor the probe's seconds.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from abtune import prose
from abtune.attrs import LOCAL_PROBE_ATTR
from abtune.config import ModelConfig, RunConfig, parse_run_config
from abtune.errors import ConfigError
from abtune.study.spec import StudySpec
from abtune.timing import ComputeSource, PlannedRun, estimate_run, load_cluster, measured_here
from abtune.words import plural

if TYPE_CHECKING:
    from abtune.data import DatasetInfo

LOCAL_LIMIT_S = 4 * 3600  # a local study estimated beyond this asks for --yes
PROBE_STEPS = 2  # timed, after one warm-up step
PROBE_BATCH = 8  # at most: the seconds a sample scale to the trial's batch
SLURM_GUIDE = "docs/first-slurm-study.md"


@dataclass(frozen=True)
class StudyCost:
    trial_seconds: float
    trials: int
    where: str  # "here: 8 ranks on 2 CPU cores" or "on cluster NAME"
    source: ComputeSource
    local: bool
    probe: dict[str, Any] | None = None  # here: what to store in the study (LOCAL_PROBE_ATTR)

    @property
    def total_seconds(self) -> float:
        return self.trial_seconds * self.trials


def _planned(base: dict[str, Any], nodes: int, ranks_per_node: int) -> tuple[PlannedRun, Any]:
    config = parse_run_config(base, "the study's base config")
    return planned_run(config, nodes, ranks_per_node), config


# --- a run's shape before it starts: its model counted on the meta device, not trained; no data read -----
DATA_SHAPES = {"digits": (10, 8), "cifar10": (10, 32), "cifar100": (100, 32), "imagenet": (1000, 224)}  # classes, px


def _classes_and_size(config: RunConfig) -> tuple[int, int]:
    classes, size = DATA_SHAPES[config.data.name]
    return classes, config.data.image_size or size


def data_shape(config: RunConfig) -> DatasetInfo:
    from abtune.data import RGB_CHANNELS, DatasetInfo  # torchvision: only where a model is built

    classes, size = _classes_and_size(config)
    return DatasetInfo(classes, size, RGB_CHANNELS, config.data.name)


def planned_run(config: RunConfig, nodes: int, ranks_per_node: int) -> PlannedRun:
    return _shaped(config, *_counts(config.model.model_dump_json(), data_shape(config)), nodes, ranks_per_node)


def _shaped(config: RunConfig, flops: int, params: int, nodes: int, ranks_per_node: int) -> PlannedRun:
    return PlannedRun(config.model.arch, flops, params, config.train.precision, config.train.local_batch_size,
                      config.train.steps, nodes, ranks_per_node)


@functools.cache
def _counts(model_json: str, info: DatasetInfo) -> tuple[int, int]:
    """(forward FLOPs a sample, parameters): a campaign's runs share one model, built once."""
    import torch

    from abtune.models import MODEL_BUILDERS, forward_flops_per_sample, parameter_count

    model = ModelConfig.model_validate_json(model_json)
    with torch.device("meta"):  # shapes only: no memory, no initialization
        params = parameter_count(MODEL_BUILDERS[model.arch](model, info))
    return forward_flops_per_sample(model, info), params


def probe_seconds_per_sample(model_config: ModelConfig, info: DatasetInfo, precision: str, batch: int) -> float:
    """One rank's training step (forward, backward, AdamW) of the model on this machine's CPU, one thread."""
    import torch
    import torch.nn.functional as F

    from abtune.models import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(model_config, info).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        images = torch.randn(batch, info.in_channels, info.image_size, info.image_size)
        labels = torch.randint(0, info.num_classes, (batch,))
        dtype = torch.bfloat16 if precision in ("bf16", "fp16") else None

        def step() -> None:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        started = time.perf_counter()
        for _ in range(PROBE_STEPS):
            step()
        return (time.perf_counter() - started) / PROBE_STEPS / batch
    finally:
        torch.set_num_threads(threads)


def study_cost(spec: StudySpec, cluster: str | None, known: dict[str, Any] | None = None) -> StudyCost:
    """The study's cost on `cluster` (a description's name or path), or here when None (`known`: the probe the
    study stored, used where it fits)."""
    layout = spec.layout
    if cluster is not None:
        described = load_cluster(cluster)
        run, _ = _planned(spec.base, layout.nproc // layout.per_node, layout.per_node)
        estimate = estimate_run(run, described)
        return StudyCost(estimate.seconds, spec.trials * spec.repeats, f"on cluster {described.name}",
                         estimate.compute_source, local=False)
    config = parse_run_config(spec.base, "the study's base config")
    batch = min(PROBE_BATCH, config.train.local_batch_size)
    probe = _probe(config, batch, known)
    run = _shaped(config, probe["flops"], probe["params"], 1, layout.nproc)
    cores = os.cpu_count() or 1
    how = f"a {PROBE_STEPS}-step probe of the trial's model at batch {batch} on one CPU thread here"
    here = measured_here(run.arch, run.forward_flops_per_sample, run.precision, probe["seconds_per_sample"],
                         layout.nproc, how)
    estimate = estimate_run(run, here, ranks_per_core=layout.nproc / cores)
    return StudyCost(estimate.seconds, spec.trials * spec.repeats,
                     f"here: {plural(layout.nproc, 'rank')} on {plural(cores, 'CPU core')}",
                     estimate.compute_source, local=True, probe=probe)


def _probe(config: RunConfig, batch: int, known: dict[str, Any] | None) -> dict[str, Any]:
    """The run's shape and the probe's seconds a sample: `known` (a study's stored probe) where it probed this
    model, data, precision and batch on this host, else probed now."""
    inputs = {"model": config.model.model_dump(mode="json"), "data": [config.data.name, _classes_and_size(config)[1]],
              "precision": config.train.precision, "batch": batch, "host": socket.gethostname(), "cores": os.cpu_count()}
    if known is not None and known.get("inputs") == inputs:
        return known
    shape = data_shape(config)
    flops, params = _counts(config.model.model_dump_json(), shape)
    return {"inputs": inputs, "flops": flops, "params": params,
            "seconds_per_sample": probe_seconds_per_sample(config.model, shape, config.train.precision, batch)}


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def cost_lines(cost: StudyCost, name: str, parallel: int = 1) -> list[str]:
    at_once = f", {parallel} at a time" if parallel > 1 else ""
    lines = [f"estimated training time {cost.where}: {duration(cost.trial_seconds)} a trial, "
             f"{duration(cost.total_seconds / parallel)} for {plural(cost.trials, 'trial')}{at_once} "
             f"(as DDP trains; compute {cost.source})"]
    if cost.local and cost.total_seconds / parallel > LOCAL_LIMIT_S:
        lines.append(f"this study is meant for GPU nodes: run it on SLURM with `abtune study launch {name} "
                     f"--launcher PROFILE --workers N`, and see its cost there with --cluster NAME "
                     f"({SLURM_GUIDE})")
    return lines


@dataclass(frozen=True)
class KeptProbe:
    """Where a study keeps its probe: a system attribute of study `study_id` in `storage` (Optuna's)."""

    storage: Any
    study_id: int

    def read(self) -> dict[str, Any] | None:
        return self.storage.get_study_system_attrs(self.study_id).get(LOCAL_PROBE_ATTR)

    def keep(self, cost: StudyCost, known: dict[str, Any] | None) -> None:
        if cost.probe is not None and cost.probe is not known:
            self.storage.set_study_system_attr(self.study_id, LOCAL_PROBE_ATTR, cost.probe)


def _cost_kept(spec: StudySpec, cluster: str | None, kept: KeptProbe | None) -> StudyCost:
    known = kept.read() if kept is not None and cluster is None else None
    cost = study_cost(spec, cluster, known)
    if kept is not None:
        kept.keep(cost, known)
    return cost


def announce(spec: StudySpec, name: str, cluster: str | None, kept: KeptProbe | None = None) -> StudyCost | None:
    """Print the study's estimated cost (standard output); an estimate that cannot be made is one line on
    standard error, never a failure of the command. `kept`: where the study keeps its probe."""
    try:
        cost = _cost_kept(spec, cluster, kept)
    except ConfigError as error:
        if cluster is not None:
            raise
        print(f"abtune: no time estimate: {error}", file=sys.stderr)
        return None
    for line in cost_lines(cost, name):
        prose.say(line)
    return cost


def stored_spec_of(storage: Any, name: str) -> StudySpec:
    from abtune.study.definition import stored_spec

    return stored_spec(storage, storage.get_study_id_from_name(name))


def check_local_run(spec: StudySpec, name: str, launcher_kind: str, cluster: str | None, parallel: int,
                    yes: bool, kept: KeptProbe | None = None) -> None:
    """Before `study run`: print the estimate (on a SLURM profile only with a cluster description); refuse a
    local study beyond LOCAL_LIMIT_S without --yes. `kept`: where the study keeps its probe."""
    if launcher_kind != "local" and cluster is None:  # no description of its nodes: nothing to say (--cluster)
        return
    try:
        cost = _cost_kept(spec, cluster if launcher_kind != "local" else None, kept)
    except ConfigError as error:
        print(f"abtune: no time estimate: {error}", file=sys.stderr)
        return
    for line in cost_lines(cost, name, parallel):
        prose.say(line)
    if cost.local and cost.total_seconds / parallel > LOCAL_LIMIT_S and not yes:
        raise ConfigError(f"study {name} would train for about {duration(cost.total_seconds / parallel)} on this "
                          f"machine; run it on SLURM (abtune study launch {name} --launcher PROFILE, "
                          f"{SLURM_GUIDE}) or pass --yes to run it here anyway")
