"""The campaign as a table: what `abtune promote --dry-run` prints and `abtune promote` shows first."""

from __future__ import annotations

from abtune import prose, tables
from abtune.promote.plan import Campaign, PlannedRun

COLUMNS = (  # (header, priority): the schedule in steps first, where a run came from last
    ("run", tables.ESSENTIAL), ("nodes", tables.ESSENTIAL), ("ranks", tables.KEY), ("local batch", tables.ESSENTIAL),
    ("global batch", tables.ESSENTIAL), ("steps/epoch", tables.KEY), ("steps", tables.ESSENTIAL),
    ("warmup", tables.ESSENTIAL), ("AB", tables.ESSENTIAL), ("rebound", tables.ESSENTIAL), ("LR rebound", tables.ESSENTIAL),
    ("method", tables.KEY), ("precision", tables.DETAIL), ("promoted from", tables.KEY))
TEXT_COLUMNS = ("run", "method", "precision", "promoted from")


def run_cells(run: PlannedRun) -> list[str]:
    schedule = run.schedule or {}

    def steps(key: str) -> str:
        return f"{schedule[key]:,}" if key in schedule else "-"

    source = "baseline" if run.promoted_from is None else f"{run.promoted_from.study} #{run.promoted_from.trial}"
    if run.promoted_from is not None and run.promoted_from.mlflow_run_id:
        source += f" (mlflow {run.promoted_from.mlflow_run_id})"
    if run.promoted_from is not None and run.promoted_from.confirmed:
        source += f"; confirmed {run.promoted_from.confirmed}"
    return [run.name, str(run.nodes), str(run.world_size), f"{run.local_batch_size:,}", f"{run.global_batch_size:,}",
            f"{run.steps_per_epoch:,}", f"{run.steps:,}", steps("warmup_steps"), steps("ab_steps"),
            steps("rebound_steps"), steps("lr_rebound_steps"), run.method, run.precision, source]


def print_campaign(campaign: Campaign, title_prefix: str = "", wide: bool = False) -> None:
    title = (f"{title_prefix}campaign {campaign.target}, constant {campaign.strategy} batch, "
             f"{campaign.epochs} epochs of {campaign.train_samples:,} samples")
    columns = [tables.Column(header, priority, "left" if header in TEXT_COLUMNS else "right",
                             wrap=header == "promoted from") for header, priority in COLUMNS]
    tables.print_table(tables.console(), title, columns, [run_cells(run) for run in campaign.runs], wide=wide,
                       elsewhere="campaign.yaml lists every run in full")
    carried = {run.configuration: run.overrides for run in campaign.runs if run.overrides}
    for name, overrides in carried.items():
        prose.say(f"{name} carries {prose.settings(overrides)}")
