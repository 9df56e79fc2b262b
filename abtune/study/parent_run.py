"""What the study's MLflow parent run says about the study: its description (what it searches, on which
objectives, within which budget), its settings as params and its progress as metrics.

The runner hands these to the tracker (`Tracking.describe_study`) when it starts and whenever it
rebuilds the study's plots; the tracker puts the plots under the description.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from abtune import prose
from abtune.attrs import REFERENCE_ATTR
from abtune.objectives import OBJECTIVES
from abtune.study.spec import Dimension, StudySpec

PROGRESS_SECTION = "Study"  # beside the trials' "Results" section, before the lower-case ones


def study_description(name: str, spec: StudySpec) -> str:
    """Markdown, a few short lines: the study's question, its search space and its budget."""
    goals = ", ".join(f"{OBJECTIVES[o].direction} {OBJECTIVES[o].label}" + (" per rank" if OBJECTIVES[o].unit == "MB" else "")
                      for o in spec.objectives)
    budget = spec.constraints.max_inter_node_mb
    within = f"; traffic budget **{budget:g} MB** inter-node per rank" if budget else ""
    repeats = f", {spec.repeats} seeds each" if spec.repeats > 1 else ""
    layout = spec.layout
    nodes = layout.nproc // layout.per_node
    section = prose.shared_section(spec.space)
    space = ", ".join(f"`{prose.short_key(key, section)}`" for key in spec.space) + (f" ({section}.*)" if section else "")
    return (f"**Study {name}**: {goals}.\n\n"
            f"Searches {space} with {spec.sampler.name}, pruner {spec.pruner.name}.\n\n"
            f"Budget **{spec.trials} trials** (reference trials included{repeats}), {layout.nproc} ranks per trial "
            f"on {nodes} node{'s' if nodes > 1 else ''}{within}.")


def study_params(spec: StudySpec) -> dict[str, Any]:
    """The study's settings as MLflow params: `space.NAME` is each searched parameter's range."""
    return {"study.objectives": ",".join(spec.objectives), "study.directions": ",".join(spec.directions),
            "study.trials": spec.trials, "study.repeats": spec.repeats, "study.sampler": spec.sampler.name,
            "study.pruner": spec.pruner.name, "study.max_inter_node_mb": spec.constraints.max_inter_node_mb,
            "study.nproc": spec.layout.nproc, "study.ranks_per_node": spec.layout.per_node,
            "method": spec.base.get("method", {}).get("name", "-"),
            **{f"space.{key}": describe_range(dimension) for key, dimension in spec.space.items()}}


def describe_range(dimension: Dimension) -> str:
    if dimension.choices is not None:
        return " | ".join(map(str, dimension.choices))
    scale = " log" if dimension.log else (f" step {dimension.step:g}" if dimension.step else "")
    return f"{dimension.low:g} .. {dimension.high:g}{scale}"


def study_progress(trials: Sequence[FrozenTrial]) -> dict[str, float]:
    """How far the study is: trials by state, and the best top-1 (percent) of its search so far."""
    counts = {state: sum(1 for t in trials if t.state == state) for state in
              (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    search = [t.user_attrs["top1"] for t in trials if t.state == TrialState.COMPLETE
              and t.user_attrs.get(REFERENCE_ATTR) is None and t.user_attrs.get("top1") is not None]
    progress = {f"{PROGRESS_SECTION}/complete": counts[TrialState.COMPLETE],
                f"{PROGRESS_SECTION}/pruned": counts[TrialState.PRUNED],
                f"{PROGRESS_SECTION}/failed": counts[TrialState.FAIL]}
    if search:
        progress[f"{PROGRESS_SECTION}/best top-1"] = round(100 * max(search), 2)
    return progress
