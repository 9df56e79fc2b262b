"""The campaign as a table: what `abtune promote --dry-run` prints and `abtune promote` shows first."""

from __future__ import annotations

from abtune.promote.plan import Campaign, PlannedRun

COLUMNS = ("run", "nodes", "ranks", "local batch", "global batch", "steps/epoch", "steps", "warmup", "AB",
           "rebound", "LR rebound", "method", "precision", "promoted from")


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


def print_campaign(campaign: Campaign, title_prefix: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    title = (f"{title_prefix}campaign {campaign.target}, constant {campaign.strategy} batch, "
             f"{campaign.epochs} epochs of {campaign.train_samples:,} samples")
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("run", "method", "precision", "promoted from") else "right")
    for run in campaign.runs:
        table.add_row(*run_cells(run))
    Console(width=200).print(table)
    carried = {run.configuration: run.overrides for run in campaign.runs if run.overrides}
    for name, overrides in carried.items():
        print(f"{name} carries " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
