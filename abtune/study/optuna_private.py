"""The few Optuna internals abtune needs, in one place, each with why no public API serves; pyproject.toml
bounds Optuna below its next major version and tests/test_optuna_private.py checks each against the
installed Optuna, so an upgrade that moves one fails there first, not in a running study.

- a trial's storage id (`_trial_id`): the storage's own calls (heartbeats, claims, intermediate values
  of another process's trial) take it, and `Trial`/`FrozenTrial` expose only the number;
- a study's storage and id (`_storage`, `_study_id`): Study exposes neither, and looking the id up by
  name would cost a storage round trip per call;
- whether a value lies in a distribution (`_contains`): what Optuna checks an enqueued trial with;
- `Study._get_trials`, which `definition.SearchStudy` overrides to hide the DDP reference from samplers
  and pruners: every sampler and pruner reads the trials through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

if TYPE_CHECKING:
    from optuna.study._frozen import FrozenStudy  # what storage.get_all_studies() returns


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The trial's id in its storage (not its number within the study)."""
    return trial._trial_id


def storage_of(study: optuna.Study) -> BaseStorage:
    return study._storage


def study_id(study: optuna.Study | FrozenStudy) -> int:
    return study._study_id


def contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether `value` (external representation) is one the distribution can take; False when it cannot
    even be represented (a string for a float range)."""
    try:
        internal = distribution.to_internal_repr(value)
    except ValueError:
        return False
    return distribution._contains(internal)
