"""Every predicted figure in the study's tables names its compute source, as `compare` does
(abtune/study/report/trial_tables.py `with_source`; the attr from abtune/study/results.py)."""

from __future__ import annotations

from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from abtune.study.report.trial_tables import objective_values
from abtune.study.spec import parse_study_spec
from tests.conftest import TINY_VIT

SPEC = parse_study_spec({"name": "t", "base": {"name": "t", "model": dict(TINY_VIT), "data": {"name": "digits"},
                                               "train": {"steps": 10, "target_top1": 0.5, "cluster": "paper-a100-hdr200"},
                                               "method": {"name": "ab"}},
                         "objectives": ["top1", "predicted_time_to_target"], "pruner": {"name": "none"},
                         "space": {"method.warmup_frac": {"low": 0.1, "high": 0.3}}}, "test")


def trial(attrs: dict) -> object:
    return create_trial(params={"method.warmup_frac": 0.2}, distributions={"method.warmup_frac": FloatDistribution(0.1, 0.3)},
                        values=[0.9, 12.5], state=TrialState.COMPLETE, user_attrs=attrs)


def test_the_recommended_line_names_the_compute_of_its_predicted_seconds() -> None:
    line = objective_values(trial({"top1": 0.9, "predicted_time_to_target": 12.5,
                                   "predicted_compute_source": "published"}), SPEC)
    assert "predicted s to target 12.50 (published)" in line and "top-1 0.9000," in line
    unnamed = objective_values(trial({"top1": 0.9, "predicted_time_to_target": 12.5}), SPEC)
    assert "(published)" not in unnamed  # a trial from before the source was kept shows the figure alone

