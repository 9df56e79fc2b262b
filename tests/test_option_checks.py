"""Sampler and pruner options are checked against Optuna's own constructors; YAML files are read one way."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from abtune.errors import ConfigError
from abtune.study.definition import PRUNERS, SAMPLER_SETS, SAMPLERS, build_pruner, build_sampler
from abtune.study.options import LOWER_BOUNDS, settable_options
from abtune.study.spec import load_study_spec
from abtune.training.hooks import configured_hook_specs
from tests.study_helpers import write_study

FACTORIES = [getattr(optuna.samplers, n) for n in SAMPLERS.values()] + [getattr(optuna.pruners, n) for n in PRUNERS.values()]


def test_every_lower_bound_names_a_numeric_option_optuna_still_has() -> None:
    """A bound for an option Optuna renamed or dropped would silently check nothing."""
    numeric = {name for factory in FACTORIES for name, option in settable_options(factory, SAMPLER_SETS).items()
               if "int" in option.shown_type or "float" in option.shown_type}
    assert set(LOWER_BOUNDS) <= numeric, set(LOWER_BOUNDS) - numeric


def test_valid_options_reach_the_sampler_and_pruner(tmp_path: Path) -> None:
    spec = load_study_spec(write_study(
        tmp_path / "s.yaml",
        sampler={"name": "tpe", "seed": 1, "options": {"n_startup_trials": 3, "multivariate": True, "n_ei_candidates": 5}},
        pruner={"name": "hyperband", "options": {"min_resource": 2, "reduction_factor": 2}},
    ))
    sampler = build_sampler(spec)
    assert (sampler._n_startup_trials, sampler._n_ei_candidates, sampler._multivariate, sampler._constant_liar) == (
        3, 5, True, True)
    pruner = build_pruner(spec)
    assert (pruner._min_resource, pruner._max_resource, pruner._reduction_factor) == (2, 30, 2)  # max: train.steps


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_builds_with_its_defaults(tmp_path: Path, name: str) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", sampler={"name": name}))
    assert isinstance(build_sampler(spec), getattr(optuna.samplers, SAMPLERS[name]))


def test_a_broken_hooks_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "hooks.yaml").write_text("- factory: a:b\n  options: {x: 1\n")
    with pytest.raises(ConfigError) as caught:
        configured_hook_specs(tmp_path)
    assert str(caught.value) == (f"{tmp_path / 'hooks.yaml'}:3:1: not valid YAML: expected ',' or '}}', "
                                 "but got '<stream end>' (while parsing a flow mapping)")
    (tmp_path / "hooks.yaml").write_text("factory: a:b\n")
    with pytest.raises(ConfigError, match="hooks.yaml: expected a YAML list at the top level, got dict"):
        configured_hook_specs(tmp_path)


def test_an_option_optuna_deprecated_is_one_warning_line_at_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from abtune.cli import main

    study = write_study(tmp_path / "s.yaml", sampler={"name": "tpe", "options": {"consider_prior": True}})
    assert main(["study", "create", str(study), "--storage", f"sqlite:///{tmp_path}/o.db"]) == 0
    assert capsys.readouterr().err == (f"abtune: warning: {study}: `consider_prior` has been deprecated in v4.3.0. "
                                       "This feature will be removed in v6.0.0. See "
                                       "https://github.com/optuna/optuna/releases/tag/v4.3.0.\n")
