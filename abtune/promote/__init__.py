"""Promotion: the best configurations of a study become scaling runs, and the scaling report.

Three adapters connect it to the rest of abtune: `promoted_from_study` (a study's trials),
`submit` (a launcher), `log_campaign` (tracking).
"""

from abtune.promote.campaign import Layout, log_campaign, run_campaign, submit, write_campaign
from abtune.promote.plan import Campaign, PlannedRun, plan_campaign
from abtune.promote.select import Promoted, Source, promoted_from_study
from abtune.promote.target import ScalingTarget, load_target

__all__ = [
    "Campaign", "Layout", "PlannedRun", "Promoted", "ScalingTarget", "Source", "load_target", "log_campaign",
    "plan_campaign", "promoted_from_study", "run_campaign", "submit", "write_campaign",
]
