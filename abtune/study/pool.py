"""Up to P runs going at once over the Job interface: the one scheduling loop of a repeated trial's
seeds (repeats.py) and of a confirmation's runs (confirm.py).

Items wait in order; `fill` starts them while fewer than `limit` run, `poll` returns the ones whose
jobs ended (the caller decides what an end means), `cancel` asks every running job to stop. A job
started by another process (a re-attached seed) joins with `adopt`. The study runner keeps a loop
of its own around the same calls: its next run is asked of the sampler when a slot frees, not taken
from a list, and it beats a heartbeat and obeys `study stop` between polls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from abtune.launch.base import Job
from abtune.launch.outcome import RunOutcome

T = TypeVar("T")


class JobPool(Generic[T]):
    def __init__(self, limit: int, start: Callable[[T], Job], waiting: Iterable[T] = ()) -> None:
        self.limit = limit
        self._start = start
        self.waiting: list[T] = list(waiting)
        self.running: list[tuple[T, Job]] = []

    def adopt(self, item: T, job: Job) -> None:
        """A job already running (started by an earlier process) counts as one of this pool's."""
        self.running.append((item, job))

    def fill(self, may_start: Callable[[], bool] = lambda: True,
             refused: Callable[[T, Exception], None] | None = None) -> None:
        """Start waiting items in order while fewer than `limit` run and `may_start()`. An item whose start
        raises is dropped; with `refused` it is told there and the filling goes on, else the error propagates."""
        while self.waiting and len(self.running) < self.limit and may_start():
            item = self.waiting.pop(0)
            try:
                self.running.append((item, self._start(item)))
            except Exception as error:  # noqa: BLE001 - the caller's `refused` decides what a refusal means
                if refused is None:
                    raise
                refused(item, error)

    def poll(self) -> list[tuple[T, RunOutcome]]:
        """The items whose jobs ended since the last poll, with how; they leave the pool."""
        ended = []
        for entry in list(self.running):
            outcome = entry[1].poll()
            if outcome is not None:
                self.running.remove(entry)
                ended.append((entry[0], outcome))
        return ended

    def cancel(self) -> None:
        for _, job in self.running:
            job.cancel()

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)
