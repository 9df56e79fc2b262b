"""The hang detector's bounds and its one line, on a clock the test moves (abtune/training/hang.py).

Runs that really hang (a frozen rank, a dead link) are in test_failures.py and test_fabric.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from abtune.config import HangConfig, load_run_config
from abtune.errors import ConfigError
from abtune.training.hang import READ_TIMEOUT_S, HangDetector, Heard, Overrun, RankId, describe_hang
from tests.conftest import write_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(clock: Clock, waiting_in: str | None = None, **settings: float) -> HangDetector:
    return HangDetector(HangConfig(**settings), RankId(3, 1), lambda: waiting_in,
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
    assert off._threads == []
    off.stop()


def test_an_untimed_bound_below_the_floor_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", train={"hang": {"floor_s": 100, "untimed_s": 10}})
    with pytest.raises(ConfigError, match=r"untimed_s \(10\) must be at least floor_s \(100\)"):
        load_run_config(config)


# --- naming the ranks that stopped, from what every rank last published --------------------------------
NOW = 5000.0
ALL_REDUCE = "all_reduce over group 'world' of 4 ranks in phase ab"


def heard(rank: int, node: int, ago: float, busy: float = 0.5, waiting: str | None = ALL_REDUCE,
          host: str = "vm", noticed: bool = False) -> Heard:
    return Heard(rank, node, host, NOW - ago, busy, "in step 42 (phase ab)", waiting, noticed)


def overrun_of_rank_0() -> tuple[Overrun, RankId, str]:
    """Rank 0 waits 4 s in step 42 (its floor: 3 s) for a peer."""
    clock = Clock()
    hang = HangDetector(HangConfig(floor_s=3, untimed_s=60), RankId(0, 0, "vm"), lambda: ALL_REDUCE, lambda: None, clock)
    with hang.doing("step", 40, "ab"):
        clock.now += 0.2
    with hang.doing("step", 41, "ab"):
        clock.now += 4
        overrun = hang.overrun()
    assert overrun is not None
    return overrun, hang.me, "rank 0 (node 0) made no progress for 4 s in step 42 (phase ab), waiting in " + ALL_REDUCE


def test_a_frozen_rank_is_named_not_the_peer_that_noticed() -> None:
    overrun, me, seen = overrun_of_rank_0()
    line = describe_hang(overrun, me, [heard(0, 0, 0.3), heard(1, 0, 0.8), heard(2, 1, 4.5, busy=1.0),
                                            heard(3, 1, 0.1)], NOW)
    # rank 2 said nothing for 4.5 s; rank 3 on its node is alive
    assert line.startswith("rank 2 (node 1) stopped responding: not heard from for 4 s, last in step 42 (phase ab); "
                           + seen), line
    assert seen + "; the bound was 3 s (train.hang.floor_s 3 s; its longest step took 0.20 s)" in line


def test_a_node_whose_ranks_all_fell_silent_is_named_with_its_host_where_hosts_differ() -> None:
    overrun, _, _ = overrun_of_rank_0()
    line = describe_hang(overrun, RankId(0, 0, "n1"), [
        heard(0, 0, 0.3, host="n1"), heard(1, 0, 0.3, host="n1"), heard(2, 1, 6, host="n2"), heard(3, 1, 7, host="n2"),
        heard(4, 2, 0.2, host="n3"), heard(5, 2, 9, host="n3")], NOW)
    assert line.startswith("node 1 (ranks 2, 3, host n2) and rank 5 (node 2, host n3) stopped responding: not heard "
                           "from for 9 s, last in step 42 (phase ab); rank 0 (node 0, host n1) made no progress for 4 s"), line


def test_a_rank_alive_outside_any_collective_while_others_wait_is_named() -> None:
    """A stalled GPU or data loader: the rank still publishes, but its step never reaches the collective."""
    overrun, me, seen = overrun_of_rank_0()
    line = describe_hang(overrun, me, [heard(0, 0, 0.3), heard(1, 0, 0.3), heard(2, 1, 0.5, busy=7, waiting=None),
                                            heard(3, 1, 0.2)], NOW)
    # its step had run 7 s when it last spoke, half a second ago
    assert line.startswith("rank 2 (node 1) held the others up: 8 s in step 42 (phase ab), outside any collective "
                           "while others wait in one; " + seen), line


def test_a_peer_that_reported_the_hang_itself_is_no_culprit_and_unknowns_say_so() -> None:
    overrun, me, seen = overrun_of_rank_0()
    # rank 1 noticed first and is ending; nobody else is silent and nobody waits outside: nothing to name
    everyone_waits = [heard(0, 0, 0.3), heard(1, 0, 5, noticed=True), heard(2, 1, 0.3), heard(3, 1, 0.3)]
    line = describe_hang(overrun, me, everyone_waits, NOW)
    assert line == (f"rank 0 (node 0) made no progress for 4 s in step 42 (phase ab), waiting in {ALL_REDUCE}; the "
                    "bound was 3 s (train.hang.floor_s 3 s; its longest step took 0.20 s): a peer, its node or the "
                    "link between them stopped responding")
    never = describe_hang(overrun, me, [heard(0, 0, 0.3), None, heard(2, 1, 0.3), heard(3, 1, 0.3)], NOW)
    assert never.startswith("rank(s) 1 never published their progress; rank 0 (node 0) made no progress for 4 s")
    unanswered = describe_hang(overrun, me, None, NOW)
    assert unanswered.endswith(f"rank 0 (node 0), which holds the rendezvous store, did not answer in "
                               f"{READ_TIMEOUT_S:g} s: it, its node or the link to it stopped responding")


def test_progress_goes_through_a_real_rendezvous_store_and_a_silent_store_is_left_behind() -> None:
    """StoreBoard against a TCPStore served here, as rank 0 serves it; a store that never answers costs the
    reading rank READ_TIMEOUT_S, not the process group's timeout."""
    import os
    import time

    import torch.distributed as dist

    from abtune.dist import StoreBoard
    from abtune.launch.local import free_port
    from abtune.training.hang import _within

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    old = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        board = StoreBoard(3, timeout_s=600)
    finally:
        for key, value in old.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    clock = Clock()
    hang = HangDetector(HangConfig(), RankId(2, 1, "n2"), lambda: None, lambda: None, clock, wall=lambda: NOW)
    board.publish(2, hang.heard().to_json())
    read = board.read()
    assert read[:2] == [None, None] and Heard.from_json(read[2]) == Heard(2, 1, "n2", NOW, 0.0, "in set-up (before "
                                                                             "the first step)", None, False)
    started = time.monotonic()
    assert _within(0.5, lambda: time.sleep(30) or []) is None
    assert time.monotonic() - started < 5
    del server
