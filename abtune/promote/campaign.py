"""Write a campaign folder and run its runs through a launcher, one after another.

CAMPAIGN/campaign.yaml describes every run; CAMPAIGN/runs/NAME is a run folder as `abtune train`
makes it (config.yaml, then summary.json) plus outcome.json (ok, reason, exit code). A failed run
is recorded and the others continue.

Adapters for the parallel work (one function each): `submit` (launcher profiles), `log_campaign`
(MLflow tracking); the study side is `abtune.promote.select.promoted_from_study`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from abtune.config import RunConfig, read_yaml
from abtune.errors import ConfigError
from abtune.promote.plan import CAMPAIGN_FILE, Campaign, PlannedRun

LAUNCHERS = ("local",)
OUTCOME_FILE = "outcome.json"


@dataclass(frozen=True)
class Layout:
    nodes: int
    ranks_per_node: int

    @property
    def nproc(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str | None = None
    exit_code: int = 0


class Job(Protocol):
    def result(self) -> Any: ...


def check_launcher(name: str) -> None:
    if name not in LAUNCHERS:
        raise ConfigError(f"--launcher {name!r}: not available here; choose one of {', '.join(LAUNCHERS)}")


def submit(run_dir: Path, layout: Layout, launcher: str) -> Job:
    """The launcher adapter: a prepared run folder becomes a job whose result() is a RunOutcome."""
    from abtune.launch.submit import submit_local

    check_launcher(launcher)
    return submit_local(run_dir, layout.nproc, layout.ranks_per_node)


def run_tags(run: PlannedRun) -> dict[str, str]:
    """What a promoted run is tagged with in tracking: the trial and run it came from."""
    tags = {"abtune.campaign_run": run.name, "abtune.nodes": str(run.nodes), "abtune.method": run.method}
    if run.promoted_from is not None:
        tags.update({"abtune.promoted_from.study": run.promoted_from.study,
                     "abtune.promoted_from.trial": str(run.promoted_from.trial)})
        if run.promoted_from.mlflow_run_id:
            tags["abtune.promoted_from.mlflow_run_id"] = run.promoted_from.mlflow_run_id
    return tags


def log_campaign(campaign_dir: Path, campaign: Campaign, outcomes: dict[str, Outcome]) -> None:
    """The tracking adapter: no tracker yet. TODO(tracking branch): log each run with run_tags(run)."""


def write_campaign(campaign_dir: Path, campaign: Campaign, configs: dict[str, RunConfig]) -> None:
    if campaign_dir.exists() and any(campaign_dir.iterdir()):
        raise ConfigError(f"{campaign_dir} is not empty; choose another --campaign-dir")
    campaign_dir.mkdir(parents=True, exist_ok=True)
    (campaign_dir / CAMPAIGN_FILE).write_text(yaml.safe_dump(campaign.model_dump(mode="json"), sort_keys=False))
    for run in campaign.runs:
        run_dir = campaign_dir / run.run_dir
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(configs[run.name].model_dump(mode="json"), sort_keys=False))


def read_campaign(campaign_dir: Path) -> Campaign:
    path = campaign_dir / CAMPAIGN_FILE
    if not path.is_file():
        raise ConfigError(f"{campaign_dir}: no {CAMPAIGN_FILE}; pass a folder written by `abtune promote`")
    return Campaign.model_validate(read_yaml(path))


Submit = Callable[[Path, Layout, str], Job]


def run_campaign(campaign_dir: Path, campaign: Campaign, launcher: str, show_progress: bool = True,
                 submit_fn: Submit = submit) -> dict[str, Outcome]:
    """Run every run in order; each outcome is also stored in its folder. A failed run does not stop the others."""
    from rich.progress import Progress

    outcomes: dict[str, Outcome] = {}
    with Progress(disable=not show_progress) as progress:
        task = progress.add_task("campaign", total=len(campaign.runs))
        for run in campaign.runs:
            progress.update(task, description=f"{run.name} ({run.world_size} ranks)")
            layout = Layout(run.nodes, run.ranks_per_node)
            outcomes[run.name] = run_one(campaign_dir / run.run_dir, layout, launcher, submit_fn)
            progress.advance(task)
    log_campaign(campaign_dir, campaign, outcomes)
    return outcomes


def run_one(run_dir: Path, layout: Layout, launcher: str, submit_fn: Submit = submit) -> Outcome:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        result = submit_fn(run_dir, layout, launcher).result()
        outcome = Outcome(result.ok, result.reason, result.exit_code)
    except (FailedJobError, UncompletedJobError) as error:
        outcome = Outcome(False, str(error).strip().splitlines()[0], 1)
    (run_dir / OUTCOME_FILE).write_text(json.dumps(asdict(outcome)))
    return outcome


def read_outcome(run_dir: Path) -> Outcome | None:
    path = run_dir / OUTCOME_FILE
    return Outcome(**json.loads(path.read_text())) if path.is_file() else None
