from __future__ import annotations

import pytest

from abtune.config import AbConfig
from abtune.methods.ab.schedule import ABSchedule, Phase


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


def test_lr_rebounds_from_near_zero_after_each_change_of_shape() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, rebound_frac=0.5, lr_rebound_frac=0.4)  # LR rebound: 4 steps
    assert s.shape_change_steps() == [10, 20, 25, 35]
    assert s.lr_factor(9) == 1.0
    assert [s.lr_factor(step) for step in range(10, 15)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert s.lr_factor(20) == pytest.approx(0.2)  # the sync rebuilds W: another change of shape


def test_no_lr_rebound_when_fraction_is_zero() -> None:
    s = schedule(40, warmup_frac=0.25, ab_frac=0.25, lr_rebound_frac=0.0)
    assert all(s.lr_factor(step) == 1.0 for step in range(40))
