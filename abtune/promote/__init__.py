"""Promotion: the best configurations of a study become scaling runs, and the scaling report.

`promoted_from_study` reads a study's trials; `run_campaign` runs the campaign through a launcher
profile and records each run in MLflow.
"""

from abtune.promote.campaign import run_campaign, write_campaign
from abtune.promote.plan import Campaign, PlannedRun, plan_campaign
from abtune.promote.select import Promoted, Source, promoted_from_study
from abtune.promote.target import ScalingTarget, load_target

__all__ = [
    "Campaign", "PlannedRun", "Promoted", "ScalingTarget", "Source", "load_target",
    "plan_campaign", "promoted_from_study", "run_campaign", "write_campaign",
]
