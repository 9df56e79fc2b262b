"""How to run a trial's configuration again where it ran, as its job's launcher says."""

from __future__ import annotations

import shlex

from optuna.trial import FrozenTrial

from abtune.attrs import (
    LAUNCHER_ATTR,
    RUN_DIR_ATTR,
)
from abtune.launch.launchers import recorded_job, rerun_args
from abtune.study.spec import StudySpec


def rerun_command(trial: FrozenTrial, spec: StudySpec) -> str:
    """`abtune train` of the trial's config where it ran, as its job's launcher says (launch.launchers.rerun_args)."""
    attrs = trial.user_attrs
    where = rerun_args(recorded_job(attrs), attrs.get(LAUNCHER_ATTR), spec.layout.nproc, spec.layout.per_node)
    return shlex.join(["abtune", "train", f"{attrs[RUN_DIR_ATTR]}/config.yaml", *where])
