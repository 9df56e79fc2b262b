"""The pruning hook: rank 0 of a trial reports to the study at each evaluation and asks whether to stop.

Named in the trial's hooks.yaml as `abtune.study.pruning:make_hook` with the study name and the
trial id; the storage URL (which may hold a password) comes from ABTUNE_STORAGE, set by the
runner (storage.storage_environment). Returning "pruned" stops every rank at the same step (the
trainer broadcasts it); the runner then tells the trial PRUNED.

At each evaluation the hook stores every objective's value there (`Objective.at_evaluation`: the
top-1 so far, the final bytes predicted from the run so far) in the trial's `evaluations`
attribute; a single-objective study also reports the top-1 as Optuna's intermediate value, which
its pruners read. (A multi-objective study must not: Optuna's TPE reads a pruned trial's
intermediate values as those of a single-objective study.) Then the study's pruner decides.

A seed of a repeated trial names the folders of the seeds that ran before it (`earlier`) and
reports the mean over them and itself at each step, over the value the previous seed left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from abtune.attrs import EVALUATIONS_ATTR
from abtune.objectives import OBJECTIVES
from abtune.study import stats
from abtune.study.definition import SearchStudy, build_pruner, stored_spec
from abtune.study.optuna_private import storage_of
from abtune.study.storage import open_storage, quiet_optuna, url_from_environment
from abtune.training.hooks import TrainingHook, evaluation_rows

PRUNED = "pruned"
StepValues = dict[str, float | None]


class PruningHook(TrainingHook):
    def __init__(self, study: optuna.Study, trial_id: int, objectives: Sequence[str], prune: bool,
                 earlier: list[str] | None = None) -> None:
        self.study, self.trial_id = study, trial_id
        self.trial = optuna.trial.Trial(study, trial_id)
        self.objectives = [m for m in objectives if OBJECTIVES[m].at_evaluation is not None]
        self.prune = prune
        self.earlier = [evaluation_rows(Path(d)) for d in earlier or []]
        stored = storage_of(study).get_trial(trial_id).user_attrs.get(EVALUATIONS_ATTR, {})
        self.evaluations: dict[str, StepValues] = dict(stored)

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        step = int(row["step"])
        rows = [row, *(seed[step] for seed in self.earlier if step in seed)]
        values = mean_values(rows, self.objectives)
        self.evaluations[str(step)] = values
        self.trial.set_user_attr(EVALUATIONS_ATTR, self.evaluations)
        if len(self.study.directions) == 1 and values.get("top1") is not None:
            # Trial.report keeps the first value of a step; a repeated trial's running mean replaces it
            storage_of(self.study).set_trial_intermediate_value(self.trial_id, step, values["top1"])
        if not self.prune:
            return None
        return PRUNED if self.study.pruner.prune(self.study, storage_of(self.study).get_trial(self.trial_id)) else None


def mean_values(rows: Sequence[dict[str, Any]], objectives: Sequence[str]) -> StepValues:
    """Each objective's value at an evaluation, the mean over `rows` (one per seed); None where one is unknown."""
    values: StepValues = {}
    for name in objectives:
        read = OBJECTIVES[name].at_evaluation
        each = [read(r) for r in rows] if read is not None else [None]
        values[name] = None if any(v is None for v in each) else stats.mean(each)  # type: ignore[arg-type]
    return values


def mean_evaluations(run_dirs: Sequence[Path], objectives: Sequence[str]) -> dict[str, StepValues]:
    """`evaluations` of a repeated trial whose seeds ran side by side: the mean at every step all evaluated."""
    seeds = [evaluation_rows(d) for d in run_dirs]
    steps = set.intersection(*(set(s) for s in seeds)) if seeds else set()
    return {str(step): mean_values([s[step] for s in seeds], objectives) for step in sorted(steps)}


def make_hook(run_dir: Path, study: str, trial_id: int, prune: bool = True,
              earlier: list[str] | None = None) -> PruningHook:
    quiet_optuna()
    storage = open_storage(url_from_environment(f"{run_dir}: the pruning hook"))
    spec = stored_spec(storage, storage.get_study_id_from_name(study))
    sampler = optuna.samplers.RandomSampler()  # never samples here; Trial() only needs one
    # SearchStudy: the pruner compares with search-space trials only, never with the DDP reference
    search = SearchStudy(study, storage, sampler=sampler, pruner=build_pruner(spec))
    return PruningHook(search, trial_id, spec.objectives, prune, earlier)
