"""JobPool: the one loop that keeps up to P runs going (a repeated trial's seeds, a confirmation's runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from abtune.launch.base import Job
from abtune.launch.outcome import RunOutcome
from abtune.study.pool import JobPool


class CountdownJob(Job):
    """Ends after `polls` polls, as `ok` says; a cancelled one ends at its next poll, not ok."""

    kind = "countdown"

    def __init__(self, name: str, polls: int, ok: bool = True) -> None:
        super().__init__(name, Path("."))
        self.left, self.ok, self.cancelled = polls, ok, False

    def poll(self) -> RunOutcome | None:
        if self.cancelled:
            return RunOutcome(False, "cancelled", 1)
        self.left -= 1
        return None if self.left > 0 else RunOutcome(self.ok, "" if self.ok else "boom", 0 if self.ok else 1)

    def cancel(self) -> None:
        self.cancelled = True


def test_at_most_limit_run_and_items_start_in_order() -> None:
    started: list[str] = []

    def start(name: str) -> Job:
        started.append(name)
        return CountdownJob(name, polls=2 if name == "a" else 1)

    pool = JobPool(2, start, ["a", "b", "c", "d"])
    ended: list[str] = []
    rounds = 0
    while pool.busy:
        pool.fill()
        assert len(pool.running) <= 2
        ended += [name for name, outcome in pool.poll() if outcome.ok]
        rounds += 1
    assert started == ["a", "b", "c", "d"] and sorted(ended) == ["a", "b", "c", "d"]
    assert ended == ["b", "a", "c", "d"] and rounds == 3  # "a" takes two polls: "c" takes "b"'s slot first


def test_an_adopted_job_takes_a_slot_and_a_refused_start_is_told_not_raised() -> None:
    pool = JobPool(1, lambda name: (_ for _ in ()).throw(RuntimeError(f"no {name}")), ["x"])
    pool.adopt("old", CountdownJob("old", polls=1))
    refusals: list[str] = []
    pool.fill(refused=lambda item, error: refusals.append(str(error)))
    assert refusals == [] and [i for i, _ in pool.running] == ["old"]  # the slot is the adopted job's
    assert [(item, outcome.ok) for item, outcome in pool.poll()] == [("old", True)]
    pool.fill(refused=lambda item, error: refusals.append(str(error)))
    assert refusals == ["no x"] and not pool.busy
    with pytest.raises(RuntimeError, match="no y"):  # without `refused`, the caller sees the error
        JobPool(1, lambda name: (_ for _ in ()).throw(RuntimeError(f"no {name}")), ["y"]).fill()


def test_may_start_stops_the_filling_and_cancel_reaches_every_running_job() -> None:
    jobs: dict[str, CountdownJob] = {}
    pool = JobPool(3, lambda name: jobs.setdefault(name, CountdownJob(name, polls=5)), ["a", "b", "c"])
    pool.fill(may_start=lambda: len(jobs) < 2)
    assert sorted(jobs) == ["a", "b"] and pool.waiting == ["c"]
    pool.cancel()
    assert sorted((item, outcome.reason) for item, outcome in pool.poll()) == [("a", "cancelled"), ("b", "cancelled")]
