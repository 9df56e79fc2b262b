from __future__ import annotations

import pytest

from abtune.methods.ab.settings import AbConfig, ABSchedule
from abtune.phases import Phase


def schedule(total: int, **fractions: float) -> ABSchedule:
    return ABSchedule.from_config(AbConfig(**fractions), total)


def test_guideline_fractions_become_absolute_steps() -> None:
    s = schedule(600)  # paper: warmup 20%, AB 3.33%, rebound 0.25 x AB, LR rebound 0.5 x AB
    assert (s.warmup_steps, s.ab_steps, s.rebound_steps, s.lr_rebound_steps) == (120, 20, 5, 10)


def test_segments_cover_every_step_once_in_order() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, rebound_frac=0.5)
    assert [(seg.phase, seg.start, seg.end) for seg in s.segments] == [
        (Phase.WARMUP, 0, 10), (Phase.AB, 10, 20), (Phase.REBOUND, 20, 25), (Phase.AB, 25, 35), (Phase.REBOUND, 35, 40),
    ]


def test_last_segment_is_truncated_to_the_budget() -> None:
    s = schedule(33, warmup_frac=0.25, ab_frac=0.25, rebound_frac=0.5)
    assert s.segments[-1].end == 33
    assert s.phase_at(32) is Phase.AB


def test_zero_warmup_starts_with_an_ab_phase() -> None:
    s = schedule(30, warmup_frac=0.0, ab_frac=0.2)
    assert s.segments[0] == s.segment_at(0)
    assert s.phase_at(0) is Phase.AB
    assert s.shape_change_steps()[0] == 0


def test_lr_rebounds_from_the_floor_after_each_change_of_shape() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, rebound_frac=0.5, lr_rebound_frac=0.4)  # LR rebound: 4 steps
    assert s.shape_change_steps() == [10, 20, 25, 35]
    assert s.learning_rate(9, 0.5) == 0.5
    floor = 1e-5  # the default, as the authors' code
    assert [s.learning_rate(step, 0.5) for step in range(10, 15)] == pytest.approx(
        [floor, floor + 0.25 * (0.5 - floor), floor + 0.5 * (0.5 - floor), floor + 0.75 * (0.5 - floor), 0.5])
    assert s.learning_rate(20, 0.5) == pytest.approx(floor)  # the sync rebuilds W: another change of shape


def test_lr_floor_above_the_schedule_never_raises_the_rate() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, lr_rebound_frac=0.4, lr_rebound_floor=0.1)
    assert s.learning_rate(10, 0.01) == 0.01


def test_no_lr_rebound_when_fraction_is_zero() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, lr_rebound_frac=0.0)
    assert all(s.learning_rate(step, 0.5) == 0.5 for step in range(40))
