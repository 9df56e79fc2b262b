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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from abtune.config import RunConfig, load_run_config
from abtune.errors import ConfigError
from abtune.launch.profiles import Layout, Profile, SlurmProfile, load_profile
from abtune.promote.plan import CAMPAIGN_FILE, Campaign, PlannedRun
from abtune.tracking import LaunchInfo, Tracking
from abtune.training.hooks import write_hook_specs
from abtune.yamlfile import read_yaml

OUTCOME_FILE = "outcome.json"


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str | None = None
    exit_code: int = 0


class Job(Protocol):
    def done(self) -> bool: ...

    def result(self) -> Any: ...


def check_launcher(name: str) -> Profile:
    return load_profile(name)


def submit(run_dir: Path, layout: Layout, launcher: str) -> Job:
    """A prepared run folder becomes a job of the run's own layout; its result is a RunOutcome."""
    from abtune.launch.submit import submit_run

    profile = load_profile(launcher)
    if isinstance(profile, SlurmProfile):
        profile = profile.model_copy(update={"nodes": layout.nodes, "tasks_per_node": layout.ranks_per_node})
    return submit_run(run_dir, layout, profile)


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
                 submit_fn: Submit = submit, tracking: Tracking | None = None) -> dict[str, Outcome]:
    """Run every run in order; each outcome is also stored in its folder. A failed run does not stop the others."""
    from rich.progress import Progress

    tracking = tracking or Tracking()
    experiment = f"scaling-{campaign.target}"
    launcher_kind = load_profile(launcher).kind
    outcomes: dict[str, Outcome] = {}
    with Progress(disable=not show_progress) as progress:
        task = progress.add_task("campaign", total=len(campaign.runs))
        for run in campaign.runs:
            progress.update(task, description=f"{run.name} ({run.world_size} ranks)")
            run_dir = campaign_dir / run.run_dir
            run_id = tracking.start_run(
                load_run_config(run_dir / "config.yaml"), experiment=experiment, run_name=run.name,
                launch_info=LaunchInfo(launcher_kind, run.world_size, run.ranks_per_node),
                tags={**run_tags(run), "abtune.campaign": str(campaign_dir.resolve())})
            if (spec := tracking.hook_spec(run_id)) is not None:
                write_hook_specs(run_dir, [spec])
            outcomes[run.name] = run_one(run_dir, Layout(run.nodes, run.ranks_per_node), launcher, submit_fn)
            tracking.finish_run(run_id, run_dir, "FINISHED" if outcomes[run.name].ok else "FAILED")
            progress.advance(task)
    return outcomes


def run_one(run_dir: Path, layout: Layout, launcher: str, submit_fn: Submit = submit) -> Outcome:
    from abtune.launch.submit import wait

    result = wait(submit_fn(run_dir, layout, launcher), run_dir)  # type: ignore[arg-type]
    outcome = Outcome(result.ok, result.reason, result.exit_code)
    (run_dir / OUTCOME_FILE).write_text(json.dumps(asdict(outcome)))
    return outcome


def read_outcome(run_dir: Path) -> Outcome | None:
    path = run_dir / OUTCOME_FILE
    return Outcome(**json.loads(path.read_text())) if path.is_file() else None
