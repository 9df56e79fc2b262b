"""The pruning hook: rank 0 of a trial reports its accuracy to the study and asks whether to stop.

Named in the trial's hooks.yaml as `abtune.study.pruning:make_hook` with the study name and the
trial id; the storage URL (which may hold a password) comes from ABTUNE_STORAGE, set by the
runner (storage.storage_environment). Returning "pruned" stops every rank at the same step (the
trainer broadcasts it); the runner then tells the trial PRUNED.

A seed of a repeated trial (see repeats.py) names the folders of the seeds that ran before it
(`earlier`) and reports the running mean at each step, over the value the previous seed left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from abtune.study.definition import SearchStudy, build_pruner, stored_spec
from abtune.study.storage import open_storage, quiet_optuna, url_from_environment
from abtune.training.hooks import TrainingHook, evaluation_curve

PRUNED = "pruned"


class PruningHook(TrainingHook):
    def __init__(self, study: optuna.Study, trial_id: int, prune: bool, earlier: list[str] | None = None) -> None:
        self.trial = optuna.trial.Trial(study, trial_id)
        self.prune = prune
        self.earlier = None if earlier is None else [evaluation_curve(Path(d)) for d in earlier]

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        value, step = float(row["val_top1"]), int(row["step"])
        if self.earlier is None:
            self.trial.report(value, step)
        else:  # Trial.report keeps the first value of a step; the running mean replaces it
            value = sum([c[step] for c in self.earlier if step in c], value) / (1 + sum(step in c for c in self.earlier))
            self.trial.storage.set_trial_intermediate_value(self.trial._trial_id, step, value)
            self.trial._cached_frozen_trial.intermediate_values[step] = value  # what should_prune reads
        return PRUNED if self.prune and self.trial.should_prune() else None


def make_hook(run_dir: Path, study: str, trial_id: int, prune: bool = True,
              earlier: list[str] | None = None) -> PruningHook:
    quiet_optuna()
    storage = open_storage(url_from_environment(f"{run_dir}: the pruning hook"))
    spec = stored_spec(storage, storage.get_study_id_from_name(study))
    sampler = optuna.samplers.RandomSampler()  # never samples here; Trial() only needs one
    # SearchStudy: the pruner compares with search-space trials only, never with the DDP reference
    return PruningHook(SearchStudy(study, storage, sampler=sampler, pruner=build_pruner(spec)), trial_id, prune,
                       earlier)
