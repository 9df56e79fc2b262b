"""pareto-asha, the pruner of multi-objective studies: which trial stops at which rung, on constructed
evaluations; the bytes it ranks on are predicted exactly from AB's schedule; and bad options end in one line."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from abtune.attrs import EVALUATIONS_ATTR, PAPER_DEFAULTS, REFERENCE_ATTR
from abtune.methods.ab.method import predict_ab_training_bytes
from abtune.methods.ab.settings import AbConfig, ABSchedule
from abtune.study.curves import describe, early_vs_final, spearman
from abtune.study.pareto_pruner import ParetoAshaPruner, crowding_distances, pareto_order, rung_steps
from abtune.study.pruning import PruningHook
from tests.study_helpers import write_study

OBJECTIVES = ["top1", "inter_node_bytes"]  # maximize, minimize
DIST = {"x": FloatDistribution(0, 1)}


def _pruner(**options: object) -> ParetoAshaPruner:
    return ParetoAshaPruner(OBJECTIVES, 90, **{"first_rung": 1 / 9, "reduction_factor": 3, "min_trials": 3, **options})


def _study(*points: tuple[dict[int, tuple[float, float]], TrialState]) -> optuna.Study:
    """A study whose trials have evaluations {step: (top1, bytes)} and the given states."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for curve, state in points:
        study.add_trial(_trial(curve, state))
    return study


def _trial(curve: dict[int, tuple[float, float]], state: TrialState = TrialState.RUNNING,
           **attrs: object) -> optuna.trial.FrozenTrial:
    values = [max(curve.values())[0], max(curve.values())[1]] if state == TrialState.COMPLETE else None
    evaluations = {str(s): {"top1": a, "inter_node_bytes": b} for s, (a, b) in curve.items()}
    return create_trial(state=state, values=values, params={"x": 0.5}, distributions=DIST,
                        user_attrs={EVALUATIONS_ATTR: evaluations, **attrs})


def _judge(study: optuna.Study, pruner: ParetoAshaPruner, curve: dict[int, tuple[float, float]], **attrs: object) -> bool:
    study.add_trial(_trial(curve, **attrs))
    return pruner.prune(study, study.get_trials()[-1])


def test_rungs_follow_the_first_rung_and_the_reduction_factor() -> None:
    assert rung_steps(300, 1 / 9, 3) == [34, 100]
    assert rung_steps(300, 0.1, 2) == [30, 60, 120, 240]
    assert _pruner().rungs == [10, 30]


def test_dominated_trials_stop_and_non_dominated_ones_continue() -> None:
    # At rung 10, three trials on one front (accuracy bought with bytes) and two dominated ones.
    front = [({10: (0.5, 100.0)}, TrialState.RUNNING), ({10: (0.6, 200.0)}, TrialState.RUNNING),
             ({10: (0.7, 300.0)}, TrialState.COMPLETE)]
    dominated = [({10: (0.4, 250.0)}, TrialState.PRUNED), ({10: (0.3, 300.0)}, TrialState.PRUNED)]
    pruner = _pruner()
    # a newcomer no one dominates, at a far end of the front: kept (6 trials at the rung keep 6 // 3 = 2)
    assert not _judge(_study(*front, *dominated), pruner, {10: (0.8, 400.0)})
    # a newcomer every front trial dominates stops
    assert _judge(_study(*front, *dominated), pruner, {10: (0.45, 290.0)})
    # the same dominated newcomer continues between rungs (judged at its first evaluation past a rung only)
    study = _study(*front, *dominated)
    assert not _judge(study, pruner, {5: (0.1, 999.0), 10: (0.9, 1.0), 20: (0.0, 999.0)})
    # and at the next rung it is judged against the trials that reached that rung
    assert _judge(_study(({10: (0.9, 1.0), 30: (0.9, 1.0)}, TrialState.COMPLETE),
                         ({10: (0.9, 1.0), 30: (0.8, 2.0)}, TrialState.COMPLETE)),
                  pruner, {10: (0.9, 1.0), 20: (0.5, 5.0), 30: (0.5, 5.0)})


def test_on_one_front_the_crowded_trial_stops_first() -> None:
    entries = {0: [0.5, -100.0], 1: [0.55, -150.0], 2: [0.6, -200.0], 3: [0.9, -900.0], 4: [0.4, -300.0]}  # scores
    assert pareto_order(entries)[:2] == [0, 3]  # the two ends of the front: infinite crowding distance
    assert pareto_order(entries)[-1] == 4  # dominated by 0 and 1: second front
    distance = crowding_distances({n: entries[n] for n in (0, 1, 2, 3)})
    assert distance[1] < distance[2]  # 1 sits between close neighbours, 2 next to the lone 3
    # four trials at the rung keep one: the newcomer 1, a crowded middle point of the front, stops
    pruner = _pruner(min_trials=1)
    study = _study(*[({10: (entries[n][0], -entries[n][1])}, TrialState.COMPLETE) for n in (0, 2, 3)])
    assert _judge(study, pruner, {10: (0.55, 150.0)})


def test_few_trials_a_reference_and_unknown_values_never_stop() -> None:
    pruner = _pruner()
    worst = {10: (0.0, 1e9)}
    assert not _judge(_study(({10: (0.9, 1.0)}, TrialState.COMPLETE)), pruner, worst)  # 2 at the rung < min_trials 3
    three = _study(({10: (0.9, 1.0)}, TrialState.COMPLETE), ({10: (0.8, 2.0)}, TrialState.COMPLETE))
    assert not _judge(three, pruner, worst, **{REFERENCE_ATTR: PAPER_DEFAULTS})
    study = _study(({10: (0.9, 1.0)}, TrialState.COMPLETE), ({10: (0.8, 2.0)}, TrialState.COMPLETE))
    study.add_trial(create_trial(state=TrialState.RUNNING, params={"x": 0.5}, distributions=DIST,
                                 user_attrs={EVALUATIONS_ATTR: {"10": {"top1": 0.0, "inter_node_bytes": None}}}))
    assert not pruner.prune(study, study.get_trials()[-1])
    assert _judge(_study(({10: (0.9, 1.0)}, TrialState.COMPLETE), ({10: (0.8, 2.0)}, TrialState.COMPLETE)),
                  pruner, worst)  # the same worst trial, now judged


def _evaluation(step: int, top1: float, predicted: float) -> dict[str, object]:
    return {"kind": "evaluation", "step": step, "total_steps": 90, "val_top1": top1,
            "predicted_training_inter_node_bytes": predicted}


def test_a_repeated_trial_is_judged_on_the_mean_over_its_seeds(tmp_path: Path) -> None:
    """Seed 2 of a trial stores the mean of seed 1 and itself; the mean decides, and a multi-objective study's
    Optuna intermediate values stay empty (Optuna's TPE would read them as a single objective's)."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/o.db")
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"], pruner=_pruner())
    for curve in ({10: (0.6, 100.0)}, {10: (0.5, 100.0)}):
        study.add_trial(_trial(curve, TrialState.COMPLETE))
    seed_1 = tmp_path / "seed_1"
    seed_1.mkdir()
    (seed_1 / "metrics.jsonl").write_text(json.dumps(_evaluation(10, 1.0, 100.0)) + "\n")
    trial = study.ask()
    hook = PruningHook(study, trial._trial_id, OBJECTIVES, prune=True, earlier=[str(seed_1)])
    # alone, 0.3 at 100 bytes would be dominated by both; with seed 1's 1.0 the mean (0.65) beats them
    assert hook.on_evaluation(_evaluation(10, 0.3, 100.0)) is None
    stored = storage.get_trial(trial._trial_id)
    assert stored.user_attrs[EVALUATIONS_ATTR] == {"10": {"top1": pytest.approx(0.65), "inter_node_bytes": 100.0}}
    assert stored.intermediate_values == {}
    alone = study.ask()
    assert PruningHook(study, alone._trial_id, OBJECTIVES, prune=True).on_evaluation(_evaluation(10, 0.3, 100.0)) == "pruned"
    study.tell(alone, state=TrialState.PRUNED)
    study.sampler = optuna.samplers.TPESampler(n_startup_trials=0, seed=0)
    study.ask({"x": FloatDistribution(0, 1)})  # TPE reads the pruned trial without a single-objective value


def _predicted(schedule: ABSchedule, steps_done: int, full: float, ab: float, sync: float) -> float | None:
    """What a run at these per-step rates has sent per phase after `steps_done` steps, fed to the predictor."""
    done = schedule.steps_by_phase(steps_done)
    so_far = {"warmup": done["warmup"] * full, "rebound": done["rebound"] * full, "ab": done["ab"] * ab,
              "sync": schedule.syncs_done(steps_done) * sync}
    return predict_ab_training_bytes(schedule, so_far, steps_done)


def test_ab_s_final_bytes_are_predicted_from_its_schedule() -> None:
    schedule = ABSchedule.from_config(AbConfig(warmup_frac=0.2, ab_frac=1 / 30, rebound_frac=0.3), 300)
    assert (schedule.warmup_steps, schedule.ab_steps, schedule.rebound_steps) == (60, 10, 3)
    full, ab, sync = 1000.0, 0.0, 400.0  # grouped AB: nothing crosses nodes during its AB steps
    steps = schedule.steps_by_phase(300)
    syncs = schedule.syncs_done(300)
    assert syncs == sum(1 for s in schedule.segments if s.phase == "ab") == 19
    final = (steps["warmup"] + steps["rebound"]) * full + steps["ab"] * ab + syncs * sync
    assert _predicted(schedule, 300, full, ab, sync) == final
    for step in (75, 100, 200, 299):  # after the first sync: exact
        assert _predicted(schedule, step, full, ab, sync) == pytest.approx(final)
    # before the first sync (in the warmup, or in the first AB phase) the ranks' savings are unknown
    assert _predicted(schedule, 30, full, ab, sync) is None
    assert _predicted(schedule, 70, full, ab, sync) is None  # the sync runs as step 70 begins
    assert _predicted(schedule, 71, full, ab, sync) == pytest.approx(final)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"pruner": {"name": "pareto-asha", "options": {"first_rung": 1.5}}},
     "pruner.options.first_rung: the first rung as a fraction of train.steps, in (0, 1); got 1.5"),
    ({"pruner": {"name": "pareto-asha", "options": {"reduction_factor": 1}}},
     "pruner.options.reduction_factor: must be >= 2, got 1"),
    ({"pruner": {"name": "pareto-asha", "options": {"rungs": 3}}},
     "pruner.options.rungs: not an option of ParetoAshaPruner; valid options: first_rung"),
    ({"pruner": {"name": "pareto-asha", "options": {"objectives": ["top1"]}}},
     "pruner.options.objectives: set by the study's objectives"),
    ({"objectives": ["top1", "time_to_target"], "base": {"train": {"target_top1": 0.5}},
      "pruner": {"name": "pareto-asha"}},
     "pruner: pareto-asha ranks trials while they run, and time_to_target is known only when a run ends"),
])
def test_bad_pareto_asha_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch, fields: dict, expected: str) -> None:
    from abtune.cli import main
    from tests.study_helpers import TINY_BASE

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ABTUNE_STORAGE", raising=False)
    if "base" in fields:
        fields = {**fields, "base": {**TINY_BASE, "train": {**TINY_BASE["train"], **fields["base"]["train"]}}}
    study = write_study(tmp_path / "bad.yaml", objectives=fields.pop("objectives", OBJECTIVES), **fields)
    code = main(["study", "create", str(study)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "optuna.db").exists()


def test_early_accuracy_against_final_is_a_rank_correlation_per_step() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [5, 6, 7, 8]) == pytest.approx(0.9486833)  # ties share their mean rank
    finals = [0.90, 0.80, 0.95, 0.70, 0.85, 0.60]
    trials = []
    for n, final in enumerate(finals):
        curve = {"10": {"top1": 0.5}, "20": {"top1": final - 0.1 if n % 2 else 1 - final}, "30": {"top1": final}}
        if n == 5:  # one trial evaluated at step 20 only after the others: 5 trials there, not 6
            curve = {"10": {"top1": 0.5}, "30": {"top1": final}}
        trials.append(create_trial(state=TrialState.COMPLETE, values=[final, 1.0], params={"x": 0.5},
                                   distributions=DIST, user_attrs={"top1": final, EVALUATIONS_ATTR: curve}))
    correlations = early_vs_final(trials)
    assert set(correlations) == {10, 20}  # step 30 is every trial's last: its final value
    assert correlations[10][1] == 6 and correlations[10][0] != correlations[10][0]  # all equal: nan
    rho, count = correlations[20]
    assert count == 5 and rho == pytest.approx(spearman([1 - 0.90, 0.70, 1 - 0.95, 0.60, 1 - 0.85],
                                                        [0.90, 0.80, 0.95, 0.70, 0.85]))
    assert describe(correlations).startswith(
        f"top-1 at an evaluation vs final top-1 (Spearman over 6 completed trials): step 10 all equal, step 20 {rho:.2f}")
    assert early_vs_final(trials[:4]) == {}  # too few trials to say anything
