"""The Optuna internals abtune uses (abtune/study/optuna_private.py) still answer as abtune reads them, on the
Optuna installed, and pyproject.toml bounds Optuna to the major version they were checked on."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from abtune.study.optuna_private import contains, storage_of, study_id, trial_id

ROOT = Path(__file__).resolve().parent.parent


def test_ids_and_storage_are_the_ones_the_public_storage_api_names() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="private", storage=optuna.storages.InMemoryStorage())
    study.ask()
    trial = study.ask()
    storage = storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    assert study_id(study) == storage.get_study_id_from_name("private")
    assert study_id(storage.get_all_studies()[0]) == study_id(study)  # a FrozenStudy too
    assert trial_id(trial) == storage.get_trial_id_from_study_id_trial_number(study_id(study), 1)
    assert trial_id(storage.get_trial(trial_id(trial))) == trial_id(trial)  # a FrozenTrial too
    assert storage.get_trial(trial_id(trial)).number == 1


def test_contains_follows_each_distribution_and_refuses_what_it_cannot_represent() -> None:
    assert contains(FloatDistribution(0.1, 0.3), 0.2) and not contains(FloatDistribution(0.1, 0.3), 0.31)
    assert contains(IntDistribution(1, 9, step=2), 3) and not contains(IntDistribution(1, 9, step=2), 4)
    assert contains(CategoricalDistribution(["with-stale", "full"]), "full")
    assert not contains(CategoricalDistribution(["with-stale", "full"]), "only-learned")
    assert not contains(FloatDistribution(0.1, 0.3), "high")


def test_the_overridden_trial_reader_keeps_its_signature() -> None:
    """definition.SearchStudy overrides Study._get_trials: every sampler and pruner reads trials through it."""
    assert list(inspect.signature(optuna.Study._get_trials).parameters) == ["self", "deepcopy", "states", "use_cache"]


def test_optuna_is_bounded_to_the_major_version_checked_here() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (optuna_line,) = [d for d in dependencies if d.startswith("optuna>")]
    upper = int(re.search(r"<\s*(\d+)", optuna_line).group(1))
    assert int(optuna.__version__.split(".")[0]) == upper - 1
