"""Write a campaign folder and run its runs through a launcher, one after another.

CAMPAIGN/campaign.yaml describes every run; CAMPAIGN/runs/NAME is a run folder as `abtune train`
makes it (config.yaml, then summary.json) plus outcome.json (ok, reason, exit code). A failed run
is recorded and the others continue.

Each run goes through the launcher profile named by --launcher (on SLURM, the profile's node and
task counts are replaced by the run's) and, with tracking on, is an MLflow run tagged with the
study trial it was promoted from.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import yaml

from abtune.config import RunConfig, load_run_config
from abtune.errors import ConfigError
from abtune.launch.base import Launcher, Layout
from abtune.launch.outcome import RunOutcome
from abtune.promote.plan import CAMPAIGN_FILE, Campaign, PlannedRun
from abtune.rundir import prepare_run_dir
from abtune.runfiles import CONFIG_FILE, OUTCOME_FILE
from abtune.runs import Run, status_of
from abtune.tracking import LaunchInfo, Tracking
from abtune.yamlfile import read_yaml


def run_tags(run: PlannedRun) -> dict[str, str]:
    """What a promoted run is tagged with in tracking: the trial and run it came from."""
    tags = {"abtune.campaign_run": run.name, "abtune.nodes": str(run.nodes), "abtune.method": run.method}
    if run.promoted_from is not None:
        tags.update({"abtune.promoted_from.study": run.promoted_from.study,
                     "abtune.promoted_from.trial": str(run.promoted_from.trial)})
        if run.promoted_from.mlflow_run_id:
            tags["abtune.promoted_from.mlflow_run_id"] = run.promoted_from.mlflow_run_id
    return tags


def write_campaign(campaign_dir: Path, campaign: Campaign, configs: dict[str, RunConfig]) -> None:
    """campaign.yaml and every run's folder with its config.yaml, before the first run starts."""
    if campaign_dir.exists() and any(campaign_dir.iterdir()):
        raise ConfigError(f"{campaign_dir} is not empty; choose another --campaign-dir")
    campaign_dir.mkdir(parents=True, exist_ok=True)
    (campaign_dir / CAMPAIGN_FILE).write_text(yaml.safe_dump(campaign.model_dump(mode="json"), sort_keys=False))
    for run in campaign.runs:
        prepare_run_dir(configs[run.name], campaign_dir / run.run_dir, resume=False)


def read_campaign(campaign_dir: Path) -> Campaign:
    path = campaign_dir / CAMPAIGN_FILE
    if not path.is_file():
        raise ConfigError(f"{campaign_dir}: no {CAMPAIGN_FILE}; pass a folder written by `abtune promote`")
    return Campaign.model_validate(read_yaml(path))


def run_campaign(campaign_dir: Path, campaign: Campaign, launcher: Launcher, show_progress: bool = True,
                 tracking: Tracking | None = None) -> dict[str, RunOutcome]:
    """Run every run in order, each on `launcher` sized to the run's layout; each outcome is also stored
    in its folder. A failed run does not stop the others."""
    from rich.progress import Progress

    tracking = tracking or Tracking()
    outcomes: dict[str, RunOutcome] = {}
    with Progress(disable=not show_progress) as progress:
        task = progress.add_task("campaign", total=len(campaign.runs))
        for planned in campaign.runs:
            progress.update(task, description=f"{planned.name} ({planned.world_size} ranks)")
            layout = Layout(planned.nodes, planned.ranks_per_node)
            run = Run(campaign_dir / planned.run_dir, launcher.resized(layout), layout, hooks=[])
            run.track(tracking, tracking.start_run(
                load_run_config(run.run_dir / CONFIG_FILE), experiment=f"scaling-{campaign.target}",
                run_name=planned.name, launch_info=LaunchInfo(launcher.kind, planned.world_size, planned.ranks_per_node),
                tags={**run_tags(planned), "abtune.campaign": str(campaign_dir.resolve())}))
            outcomes[planned.name] = run_one(run)
            progress.advance(task)
    return outcomes


def run_one(run: Run) -> RunOutcome:
    run.submit()
    outcome = run.wait()
    (run.run_dir / OUTCOME_FILE).write_text(json.dumps(asdict(outcome)))
    run.finish(status_of(outcome))
    return outcome


def read_outcome(run_dir: Path) -> RunOutcome | None:
    path = run_dir / OUTCOME_FILE
    return RunOutcome(**json.loads(path.read_text())) if path.is_file() else None
