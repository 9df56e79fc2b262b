"""Which searched parameters mattered: importances per objective, and parameters that changed nothing
(study.importance), as `study best`, `study status` and `promote` show them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, create_trial

from abtune.runfiles import RunSummary
from abtune.study import repeats, results
from abtune.study.importance import analysis, importances, inert_parameters
from tests.conftest import CliResult
from tests.study_helpers import write_study

SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.sigma_cutoff": FloatDistribution(0.01, 0.5, log=True)}
OBJECTIVES = ["top1", "inter_node_bytes"]
SCHEDULE = {"total_steps": 300, "warmup_steps": 60, "ab_steps": 10, "rebound_steps": 3, "lr_rebound_steps": 5,
            "ab_cycles": 19}


def _trial(warmup: float, cutoff: float, top1: float, nbytes: float, ranks: dict[str, int], compression: float,
           schedule: dict[str, int] | None = None, **attrs: Any) -> FrozenTrial:
    steps = schedule or {**SCHEDULE, "warmup_steps": round(300 * warmup)}
    return create_trial(params={"method.warmup_frac": warmup, "method.sigma_cutoff": cutoff}, distributions=SPACE,
                        values=[top1, nbytes], user_attrs={"top1": top1, "inter_node_bytes": nbytes,
                                                           "compression": compression, "first_ranks": ranks,
                                                           "schedule_steps": steps, "run_dir": "runs/t", **attrs})


def _unfactored(warmup: float, cutoff: float, top1: float, nbytes: float) -> FrozenTrial:
    return _trial(warmup, cutoff, top1, nbytes, {}, 1.0)


INERT_CUTOFF = [_unfactored(0.2, 0.1, 0.95, 56e6), _unfactored(0.12, 0.0104, 0.96, 50e6),
                _unfactored(0.25, 0.3, 0.94, 60e6), _unfactored(0.18, 0.05, 0.95, 55e6)]
ACTIVE_CUTOFF = [_trial(0.2, 0.1, 0.95, 56e6, {"a": 30, "b": 11}, 2.85),
                 _trial(0.12, 0.04, 0.96, 50e6, {"a": 60}, 1.1),
                 _trial(0.25, 0.3, 0.94, 60e6, {"a": 5, "b": 7}, 6.1),
                 _trial(0.18, 0.05, 0.95, 55e6, {}, 1.0)]


def _summary(**extra: Any) -> RunSummary:
    return RunSummary({"final": {"val_top1": 0.9}, "best_top1": 0.9, "steps_done": 300, "stopped_early": None,
                       "timing": {"train_seconds": 1.0}, "traffic": {"training_inter_node_bytes": 400.0},
                       "compression": {"trained_model_ratio": 1.0, "ecr_percent": 0.0}, **extra})


def test_a_trial_records_the_first_ranks_and_the_schedule_in_steps() -> None:
    """What the runner stores on a trial (results.result_attrs), and what the inert check reads."""
    decompositions = [{"step": 60, "ranks": {"blocks.0.attn.qkv.weight": 12}}, {"step": 90, "ranks": {}}]
    attrs = results.result_attrs(_summary(decompositions=decompositions, schedule=SCHEDULE), 1.0)
    assert (attrs["first_ranks"], attrs["schedule_steps"]) == ({"blocks.0.attn.qkv.weight": 12}, SCHEDULE)
    nothing = results.result_attrs(_summary(decompositions=[{"step": 60, "ranks": {}}], schedule=SCHEDULE), 1.0)
    assert nothing["first_ranks"] == {}  # decomposed, factored nothing
    ddp = results.result_attrs(_summary(), 1.0)
    assert (ddp["first_ranks"], ddp["schedule_steps"]) == (None, None)  # never decomposes, no AB schedule
    seeds = repeats.aggregate({0: attrs, 1000: {**attrs, "top1": 0.8}}, 2.0)  # a trial with seed repeats
    assert (seeds["first_ranks"], seeds["schedule_steps"]) == (attrs["first_ranks"], SCHEDULE)


def test_a_cutoff_under_which_nothing_was_factored_is_inert() -> None:
    inert = inert_parameters(INERT_CUTOFF, list(SPACE), OBJECTIVES)
    assert [p.name for p in inert] == ["method.sigma_cutoff"]  # warmup moved the schedule: it acted
    assert inert[0].describe() == ("method.sigma_cutoff changed nothing: it took 4 values in [0.0104, 0.3] but every "
                                   "trial factored nothing (compression 1.00:1)")


def test_a_cutoff_that_moved_the_ranks_is_not_inert() -> None:
    assert inert_parameters(ACTIVE_CUTOFF, list(SPACE), OBJECTIVES) == []


def test_a_fraction_that_rounds_to_the_same_schedule_is_inert() -> None:
    same = [_trial(w, c, t, b, {"a": r}, 2.0, schedule=SCHEDULE) for w, c, t, b, r in
            [(0.2, 0.1, 0.95, 56e6, 30), (0.201, 0.2, 0.94, 50e6, 12), (0.199, 0.05, 0.96, 60e6, 40)]]
    inert = inert_parameters(same, list(SPACE), OBJECTIVES)
    assert [p.name for p in inert] == ["method.warmup_frac"]
    assert "every trial ran the same schedule in steps (warmup 60, AB 10 x19, rebound 3, LR rebound 5)" in inert[0].describe()


def test_the_ddp_reference_and_a_parameter_with_one_value_are_not_judged() -> None:
    ddp = create_trial(params={}, distributions={}, values=[0.97, 140e6],
                       user_attrs={"top1": 0.97, "inter_node_bytes": 140e6, "compression": 1.0, "reference": "ddp"})
    one_value = [_unfactored(0.2, 0.1, 0.95, 56e6), _unfactored(0.25, 0.1, 0.94, 60e6), ddp]
    assert inert_parameters(one_value, list(SPACE), OBJECTIVES) == []


def test_trials_that_did_not_record_what_a_parameter_drives_are_not_judged() -> None:
    """A study run before abtune stored ranks and schedules: no false alarm."""
    old = [create_trial(params=t.params, distributions=t.distributions, values=t.values,
                        user_attrs={k: v for k, v in t.user_attrs.items() if k not in ("first_ranks", "schedule_steps")})
           for t in INERT_CUTOFF]
    assert inert_parameters(old, list(SPACE), OBJECTIVES) == []


def test_importances_per_objective_cover_every_searched_parameter() -> None:
    values = importances(ACTIVE_CUTOFF, OBJECTIVES)
    assert list(values) == OBJECTIVES
    for by_param in values.values():
        assert set(by_param) == set(SPACE) and sum(by_param.values()) == pytest.approx(1.0)


def test_importances_need_two_search_trials() -> None:
    with pytest.raises(ValueError, match="1 completed search trial"):
        importances(ACTIVE_CUTOFF[:1], OBJECTIVES)


def test_importances_need_a_searched_parameter_that_took_two_values() -> None:
    """Optuna would answer 0.5 and 0.5 here, as if both parameters mattered alike."""
    twice = [_trial(0.2, 0.1, 0.95, 56e6, {"a": 30}, 2.85), _trial(0.2, 0.1, 0.96, 50e6, {"a": 30}, 2.85)]
    with pytest.raises(ValueError, match="no searched parameter took two values"):
        importances(twice, OBJECTIVES)
    assert analysis(twice, list(SPACE), OBJECTIVES)["importances"] is None


def test_an_objective_that_never_changed_ranks_no_parameter() -> None:
    same_top1 = [_trial(w, c, 0.95, b, {"a": r}, 2.0) for w, c, b, r in
                 [(0.2, 0.1, 56e6, 30), (0.12, 0.04, 50e6, 60), (0.25, 0.3, 60e6, 5)]]
    result = analysis(same_top1, list(SPACE), OBJECTIVES)
    assert list(result["importances"]) == ["inter_node_bytes"]
    assert result["importances_skipped"] == {"top1": "every search trial had the same top1"}
    flat = [_trial(w, c, 0.95, 56e6, {"a": 30}, 2.0) for w, c in [(0.2, 0.1), (0.12, 0.04)]]
    result = analysis(flat, list(SPACE), OBJECTIVES)
    assert result["importances"] is None
    assert result["importances_missing"] == ("every search trial had the same top1; every search trial had the "
                                             "same inter_node_bytes")


# --- where a user reads it --------------------------------------------------------------------------


def _stored_study(tmp_path: Path, trials: list[FrozenTrial], abtune_main: Callable[..., CliResult]) -> str:
    """A study created by the CLI from a study file, its trials added as a runner would have stored them."""
    space = {"method.warmup_frac": {"low": 0.1, "high": 0.3}, "method.sigma_cutoff": {"low": 0.01, "high": 0.5, "log": True}}
    study_file = write_study(tmp_path / "s.yaml", space=space, objectives=OBJECTIVES, trials=8,
                             references={"paper_defaults": False, "ddp": False})
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert abtune_main("study", "create", str(study_file), "--storage", url, cwd=tmp_path).returncode == 0
    optuna.load_study(study_name="tiny", storage=url).add_trials(trials)
    return url


def test_study_best_shows_importances_and_warns_of_the_inert_cutoff(tmp_path: Path,
                                                                    abtune_main: Callable[..., CliResult]) -> None:
    url = _stored_study(tmp_path, INERT_CUTOFF, abtune_main)
    out = abtune_main("study", "best", "tiny", "--storage", url, cwd=tmp_path).stdout
    title = ("parameter importances (Optuna's default evaluator, per objective, over 4 search trials; p: against 19 "
             "shufflings of the objective's values)")
    assert title in " ".join(out.split())  # rich wraps a title to its table's width
    rows = re.findall(r"^│ (method\.\w+(?: \(changed nothing\))?) +│ ([\d.]+) \(p [\d.]+\) +│ ([\d.]+) \(p [\d.]+\) +│$",
                      out, re.MULTILINE)
    assert sorted(r[0] for r in rows) == ["method.sigma_cutoff (changed nothing)", "method.warmup_frac"], out
    for column in (1, 2):
        assert sum(float(r[column]) for r in rows) == pytest.approx(1.0, abs=0.002)
    assert "warning: method.sigma_cutoff changed nothing: it took 4 values in [0.0104, 0.3]" in out
    status = abtune_main("study", "status", "tiny", "--storage", url).stdout
    assert "warning: method.sigma_cutoff changed nothing" in status


def test_study_best_with_one_trial_says_in_one_line_that_importances_need_more(
        tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    url = _stored_study(tmp_path, INERT_CUTOFF[:1], abtune_main)
    out = abtune_main("study", "best", "tiny", "--storage", url).stdout
    lines = [line for line in out.splitlines() if "importances" in line]
    assert lines == ["parameter importances: not yet (1 completed search trial(s): importances need at least 2)"], out


def test_promote_says_when_it_carries_an_inert_parameter(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    url = _stored_study(tmp_path, INERT_CUTOFF, abtune_main)
    target = Path(__file__).parent.parent / "studies" / "imagenet_vit_b16.yaml"
    result = abtune_main("promote", "tiny", "--storage", url, "--to", str(target), "--top", "1", "--nodes", "2",
                         "--scaling", "local", "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "changed nothing" in line]
    assert lines == ["abtune: warning: promote: method.sigma_cutoff=0.0104 changed nothing in study tiny: every trial "
                     "factored nothing (compression 1.00:1); its value in the scaling runs is untested"], result.stderr
