"""How to run a trial's configuration again where it ran, as its job's launcher says."""

from __future__ import annotations

import shlex

from optuna.trial import FrozenTrial

from abtune.attrs import (
    LAUNCHER_ATTR,
    RUN_DIR_ATTR,
)
from abtune.errors import ConfigError
from abtune.launch.launchers import load_profile, recorded_job, rerun_args
from abtune.launch.profiles import FabricFault
from abtune.study.spec import StudySpec


def rerun_command(trial: FrozenTrial, spec: StudySpec) -> str:
    """`abtune train` of the trial's config where it ran, as its job's launcher says (launch.launchers.rerun_args)."""
    attrs = trial.user_attrs
    where = rerun_args(recorded_job(attrs), attrs.get(LAUNCHER_ATTR), spec.layout.nproc, spec.layout.per_node)
    return shlex.join(["abtune", "train", f"{attrs[RUN_DIR_ATTR]}/config.yaml", *where])


def repeated_faults_note(trial: FrozenTrial) -> str | None:
    """A note when the rerun's launcher profile injects faults (a drill's link down): the command repeats them."""
    source = trial.user_attrs.get(LAUNCHER_ATTR)
    try:
        fabric = getattr(load_profile(source), "fabric", None) if source else None
    except ConfigError:  # the profile moved or changed since: nothing to say about it
        return None
    if fabric is None or not fabric.faults:
        return None
    return (f"note: launcher {source} injects fabric.faults ({', '.join(map(_fault_words, fabric.faults))}), "
            f"which that command repeats; to run the configuration alone, use a copy of {source} without faults")


def _fault_words(fault: FabricFault) -> str:
    changes = [f"link {fault.link}" if fault.link else "",
               f"loss {fault.loss_pct}%" if fault.loss_pct is not None else "",
               f"latency {fault.latency_ms} ms" if fault.latency_ms is not None else ""]
    return f"node {fault.node} {' '.join(filter(None, changes))} at step {fault.at_step}"
