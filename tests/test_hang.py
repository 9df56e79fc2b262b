"""The hang detector's bounds and its one line, on a clock the test moves (abtune/training/hang.py).

Runs that really hang (a frozen rank, a dead link) are in test_failures.py and test_fabric.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from abtune.config import HangConfig, load_run_config
from abtune.errors import ConfigError
from abtune.training.hang import HangDetector
from tests.conftest import write_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(clock: Clock, waiting_in: str | None = None, **settings: float) -> HangDetector:
    return HangDetector(HangConfig(**settings), "rank 3 (node 1)", lambda: waiting_in,
                        lambda: "all_reduce over group 'world' of 4 ranks in phase ab", clock)


def test_set_up_and_first_steps_are_held_to_the_untimed_bound() -> None:
    clock = Clock()
    hang = detector(clock, floor_s=5, untimed_s=60)
    clock.now += 59
    assert hang.check() is None
    clock.now += 2
    message = hang.check()
    assert message is not None and message.startswith("rank 3 (node 1) made no progress for 61 s in set-up")
    assert "train.hang.untimed_s 60 s: no set-up timed yet" in message


def test_a_step_is_held_to_the_floor_then_to_factor_times_the_longest_step() -> None:
    clock = Clock()
    hang = detector(clock, waiting_in="all_reduce over group 'ab_a' of 2 ranks in phase ab",
                    factor=10, floor_s=5, untimed_s=60)
    with hang.doing("step", 0, "warmup"):
        clock.now += 0.2  # 10 x 0.2 s = 2 s: under the floor
    with hang.doing("step", 1, "ab"):
        clock.now += 5
        assert hang.check() is None
        clock.now += 0.5
        message = hang.check()
    assert message is not None
    assert "in step 2 (phase ab), waiting in all_reduce over group 'ab_a' of 2 ranks in phase ab" in message
    assert "the bound was 5 s (train.hang.floor_s 5 s; its longest step took 0.20 s)" in message
    # that step finished after all (5.5 s): a slow step raises the bound to 10 x 6 s
    with hang.doing("step", 2, "ab"):
        clock.now += 6
    with hang.doing("step", 3, "ab"):
        clock.now += 59
        assert hang.check() is None
        clock.now += 2
        message = hang.check()
    assert message is not None and "the bound was 60 s (10 x its longest step, 6.00 s (train.hang.factor))" in message


def test_each_kind_of_work_has_its_own_times() -> None:
    clock = Clock()
    hang = detector(clock, factor=10, floor_s=1, untimed_s=100)
    with hang.doing("step", 0, "train"):
        clock.now += 0.5
    with hang.doing("evaluation", 1, "train"):
        clock.now += 50  # the first evaluation: untimed, may take long
        assert hang.check() is None
    with hang.doing("evaluation", 2, "train"):
        clock.now += 499
        assert hang.check() is None
        clock.now += 2
        message = hang.check()
    assert message is not None and "in the evaluation after step 2 (phase train)" in message
    assert "not in a collective (the last it issued: all_reduce over group 'world' of 4 ranks in phase ab)" in message


def test_between_pieces_of_work_the_floor_holds_and_the_end_is_untimed() -> None:
    clock = Clock()
    hang = detector(clock, floor_s=5, untimed_s=60)
    with hang.doing("step", 0, "train"):
        clock.now += 0.1
    clock.now += 6
    message = hang.check()
    assert message is not None and "between pieces of work after step 0 (phase train)" in message
    hang.ending(1, "train")
    clock.now += 59
    assert hang.check() is None
    clock.now += 2
    message = hang.check()
    assert message is not None and "at the end of the run, after step 1" in message


def test_the_thread_reports_once_and_a_disabled_detector_never_starts() -> None:
    clock = Clock()
    hang = detector(clock, floor_s=1, untimed_s=1)
    heard: list[str] = []
    called = threading.Event()
    hang.start(lambda message: (heard.append(message), called.set()))
    clock.now += 2
    assert called.wait(10)
    hang.stop()
    assert len(heard) == 1 and "made no progress for 2 s in set-up" in heard[0]

    off = detector(Clock(), enabled=False, floor_s=1, untimed_s=1)
    off.start(lambda message: pytest.fail(message))
    assert off._thread is None
    off.stop()


def test_an_untimed_bound_below_the_floor_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", train={"hang": {"floor_s": 100, "untimed_s": 10}})
    with pytest.raises(ConfigError, match=r"untimed_s \(10\) must be at least floor_s \(100\)"):
        load_run_config(config)
