"""The one list of phases: what the trackers record and the time model reads of each."""

from __future__ import annotations

from abtune.phases import TRAINING_PHASES, UNKNOWN_CODE, Phase, code_of, colour_of, in_order


def test_the_train_phase_metric_keeps_its_values_and_an_unknown_phase_reads_as_none() -> None:
    assert {p.value: code_of(p) for p in Phase if code_of(p) != UNKNOWN_CODE} == {
        "train": 0, "warmup": 1, "ab": 2, "rebound": 3}
    assert code_of("an-older-phase") == UNKNOWN_CODE == -1
    assert colour_of("an-older-phase") == colour_of(Phase.EVAL)


def test_training_phases_overlap_their_all_reduces_except_ab_s_sync() -> None:
    assert [p.value for p in TRAINING_PHASES] == ["train", "warmup", "ab", "sync", "rebound"]
    assert [p.value for p in Phase if p.overlapped] == ["train", "warmup", "ab", "rebound"]
    assert not any(p.overlapped for p in Phase if not p.training)


def test_phases_are_listed_as_a_run_meets_them_with_unknown_ones_last() -> None:
    assert in_order(["report", "zeta", "eval", "ab", "alpha", "setup"]) == ["setup", "ab", "eval", "report", "alpha", "zeta"]
    assert all(type(name) is str for name in in_order([Phase.AB]))  # plain names: they go into JSON and checkpoints
