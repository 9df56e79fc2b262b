"""What a method's settings declare is what the study and promote read: its default search space and
guideline, its promoted fields (abtune/methods/settings.py); a method that declares none gets none."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from abtune import methods
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS, declared_keys, declaring
from abtune.methods.ab.settings import AbConfig
from abtune.methods.ddp.settings import DdpConfig
from abtune.methods.settings import MethodSettings
from abtune.promote.select import promote_trial
from abtune.study.lifecycle import validate
from abtune.study.spec import load_study_spec


def _study_file(folder: Path, method: str, space: str = "") -> Path:
    path = folder / f"{method}.yaml"
    path.write_text(f"name: s\nbase: {{method: {{name: {method}}}, train: {{steps: 20}}}}\n{space}")
    return path


def test_a_study_file_without_space_searches_what_its_method_declares(tmp_path: Path) -> None:
    spec = load_study_spec(_study_file(tmp_path, "ab"))
    assert {name: dim.model_dump(exclude_defaults=True) for name, dim in spec.space.items()} == {
        f"method.{field}": dict(dim) for field, dim in AbConfig.default_space.items()}
    given = load_study_spec(_study_file(tmp_path, "ab", "space: {method.rank_cap: {low: 0.5, high: 1.0}}\n"))
    assert list(given.space) == ["method.rank_cap"]  # a space given is the space


def test_a_method_that_declares_no_space_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    path = _study_file(tmp_path, "ddp")
    assert load_study_spec(path).space == {}  # read as it is; refused where a study is made of it
    with pytest.raises(ConfigError) as error:
        validate(load_study_spec(path), str(path))
    assert str(error.value) == (f"{path}: space: empty, and method 'ddp' declares no default search space; list "
                                "the fields to search under space:")


def test_a_promoted_trial_carries_its_method_and_its_declared_fields_only() -> None:
    params = {"method.name": "ab", "method.sigma_cutoff": 0.2, "method.rank_cap": 0.5, "train.lr": 0.1}
    trial = optuna.trial.create_trial(params=params, distributions={
        "method.name": optuna.distributions.CategoricalDistribution(["ab", "ab-nogroups"]),
        "method.sigma_cutoff": optuna.distributions.FloatDistribution(0.01, 0.5),
        "method.rank_cap": optuna.distributions.FloatDistribution(0.1, 1.0),
        "train.lr": optuna.distributions.FloatDistribution(0.01, 1.0)}, value=0.9)
    promoted = promote_trial("s", trial)
    assert promoted.overrides == {"method.name": "ab", "method.sigma_cutoff": 0.2}
    assert promoted.dropped == ("method.rank_cap", "train.lr")
    assert "method.rank_cap" not in AbConfig.keys(AbConfig.promoted_fields)  # why it is dropped


def test_the_registry_answers_for_a_method_added_by_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    class LocalSgd(MethodSettings):
        name: str = "localsgd"
        period: int = 4
        default_space = {"period": {"low": 1, "high": 16}}
        promoted_fields = ("period",)
        schedule_fields = ("period",)

    monkeypatch.setitem(methods.METHOD_CONFIGS, "localsgd", LocalSgd)
    assert declared_keys("promoted_fields")[-1] == "method.period"
    assert declaring("method.period", "schedule_fields") is LocalSgd
    assert declaring("method.sigma_cutoff", "rank_fields") is AbConfig
    assert declaring("method.period", "rank_fields") is None


def test_the_base_declares_nothing_and_ddp_adds_nothing() -> None:
    for declaration in ("guideline", "default_space", "promoted_fields", "schedule_fields", "rank_fields"):
        assert not getattr(DdpConfig, declaration), declaration
    assert DdpConfig().spectrum_cutoff() is None and AbConfig(sigma_cutoff=0.2).spectrum_cutoff() == 0.2
    assert MethodSettings.schedule_text({"warmup_steps": 3}) == "warmup_steps 3"
    assert AbConfig.schedule_text(AbConfig().phase_schedule(300).describe()) == "warmup 60, AB 10 x19, rebound 3, LR rebound 5"
    assert set(METHOD_CONFIGS) >= {"ab", "ddp"}
