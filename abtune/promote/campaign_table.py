"""The campaign as a table: what `abtune promote --dry-run` prints and `abtune promote` shows first."""

from __future__ import annotations

from collections.abc import Iterable

from abtune import prose, tables
from abtune.methods import METHOD_CONFIGS
from abtune.promote.plan import Campaign, PlannedRun

LEADING = (  # (header, priority): the run and its size first, the schedule in steps, where a run came from last
    ("run", tables.ESSENTIAL), ("nodes", tables.ESSENTIAL), ("ranks", tables.KEY), ("local batch", tables.ESSENTIAL),
    ("global batch", tables.ESSENTIAL), ("steps/epoch", tables.KEY), ("steps", tables.ESSENTIAL))
TRAILING = (("method", tables.KEY), ("precision", tables.DETAIL), ("promoted from", tables.KEY))
TEXT_COLUMNS = ("run", "method", "precision", "promoted from")


def schedule_columns(campaign: Campaign) -> dict[str, str]:
    """Header -> key of the schedule in steps, as the campaign's methods declare them (schedule_columns)."""
    return {header: key for run in campaign.runs
            for header, key in METHOD_CONFIGS[run.method].schedule_columns.items()}


def run_cells(run: PlannedRun, schedule_keys: Iterable[str]) -> list[str]:
    schedule = run.schedule or {}

    def steps(key: str) -> str:
        return f"{schedule[key]:,}" if key in schedule else "-"

    source = "baseline" if run.promoted_from is None else f"{run.promoted_from.study} #{run.promoted_from.trial}"
    if run.promoted_from is not None and run.promoted_from.mlflow_run_id:
        source += f" (mlflow {run.promoted_from.mlflow_run_id})"
    if run.promoted_from is not None and run.promoted_from.confirmed:
        source += f"; confirmed {run.promoted_from.confirmed}"
    return [run.name, str(run.nodes), str(run.world_size), f"{run.local_batch_size:,}", f"{run.global_batch_size:,}",
            f"{run.steps_per_epoch:,}", f"{run.steps:,}", *map(steps, schedule_keys), run.method, run.precision, source]


def print_campaign(campaign: Campaign, title_prefix: str = "", wide: bool = False) -> None:
    title = (f"{title_prefix}campaign {campaign.target}, constant {campaign.strategy} batch, "
             f"{campaign.epochs} epochs of {campaign.train_samples:,} samples")
    schedule = schedule_columns(campaign)
    headers = [*LEADING, *((header, tables.ESSENTIAL) for header in schedule), *TRAILING]
    columns = [tables.Column(header, priority, "left" if header in TEXT_COLUMNS else "right",
                             wrap=header == "promoted from") for header, priority in headers]
    rows = [run_cells(run, schedule.values()) for run in campaign.runs]
    tables.print_table(tables.console(), title, columns, rows, wide=wide,
                       elsewhere="campaign.yaml lists every run in full")
    carried = {run.configuration: run.overrides for run in campaign.runs if run.overrides}
    for name, overrides in carried.items():
        prose.say(f"{name} carries {prose.settings(overrides)}")
