"""Hung ranks: a rank that makes no progress for too long ends its run in one line.

A dead link or a frozen peer leaves every rank waiting in a collective until the process group's
timeout (`train.pg_timeout_s`; gloo's own default is 30 minutes, NCCL's 10): on SLURM the job holds
its nodes, and its study worker, that long. So each rank times its own work, by kind (a step, an
evaluation, a checkpoint), and a thread of its own checks once a second that the work under way has
not run longer than `factor` times the longest of its kind so far, or `floor_s`, whichever is larger
(`untimed_s` for work with no time of its kind yet: set-up, the first step, evaluation or checkpoint,
the end of the run).

A hung rank writes one line (rank, node, the work, its step and phase, the collective it waits in)
to the run's failures and ends its process at once. It must: the main thread is blocked inside a C++
collective, which nothing in Python can interrupt, and the check runs only because a collective
releases the GIL while it waits. The launcher then stops the other ranks (local: its poll; SLURM:
`srun --kill-on-bad-exit`), and a study retries the trial from its checkpoint like any failed one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from abtune.config import HangConfig

CHECK_SECONDS = 1.0
HUNG = "made no progress for"  # in every hung rank's line: how a study tells a hang from other failures
BETWEEN = "between"  # the loop's own code between two timed pieces of work (logging, hooks)


@dataclass(frozen=True)
class Work:
    kind: str  # set-up, step, evaluation, checkpoint, end, between
    step: int
    phase: str
    started: float


def _where(work: Work) -> str:
    if work.kind == "step":
        return f"in step {work.step + 1} (phase {work.phase})"
    if work.kind == BETWEEN:
        return f"between pieces of work after step {work.step} (phase {work.phase})"
    if work.kind == "set-up":
        return "in set-up (before the first step)"
    if work.kind == "end":
        return f"at the end of the run, after step {work.step}"
    return f"in the {work.kind} after step {work.step} (phase {work.phase})"


def is_hang(reason: str | None) -> bool:
    return reason is not None and HUNG in reason


class HangDetector:
    """Times a rank's work and calls `on_hang` with the one line when the work under way overruns.

    `waiting_in`: the collective this rank is blocked in, if any (the meter's `waiting_in`), and
    `last_issued` the last it started; both are read from the checking thread.
    """

    def __init__(self, settings: HangConfig, who: str, waiting_in: Callable[[], str | None],
                 last_issued: Callable[[], str | None], clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.who = who
        self._waiting_in = waiting_in
        self._last_issued = last_issued
        self._clock = clock
        self._longest: dict[str, float] = {}
        self._work = Work("set-up", 0, "setup", clock())
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the rank's side --------------------------------------------------------------------
    @contextmanager
    def doing(self, kind: str, step: int, phase: str) -> Iterator[None]:
        """Time one piece of work of `kind`; its time counts only when it finishes."""
        with self._lock:
            self._work = Work(kind, step, phase, self._clock())
        yield
        with self._lock:
            took = self._clock() - self._work.started
            self._longest[kind] = max(self._longest.get(kind, 0.0), took)
            self._work = Work(BETWEEN, step, phase, self._clock())

    def ending(self, step: int, phase: str) -> None:
        """The run's last collectives (the summary's, the final barrier): untimed."""
        with self._lock:
            self._work = Work("end", step, phase, self._clock())

    # --- the check --------------------------------------------------------------------------
    def bound(self, kind: str) -> tuple[float, str]:
        """Seconds `kind` of work may run, and why (for the one line)."""
        settings = self.settings
        if kind == BETWEEN:
            return settings.floor_s, f"train.hang.floor_s {settings.floor_s:g} s"
        longest = self._longest.get(kind)
        if longest is None:
            return settings.untimed_s, f"train.hang.untimed_s {settings.untimed_s:g} s: no {kind} timed yet"
        scaled = settings.factor * longest
        if scaled <= settings.floor_s:
            return settings.floor_s, f"train.hang.floor_s {settings.floor_s:g} s; its longest {kind} took {longest:.2f} s"
        return scaled, f"{settings.factor:g} x its longest {kind}, {longest:.2f} s (train.hang.factor)"

    def check(self) -> str | None:
        """The one line when the work under way has overrun its bound, else None."""
        with self._lock:
            work = self._work
            waited = self._clock() - work.started
            limit, why = self.bound(work.kind)
        if waited <= limit:
            return None
        waiting = self._waiting_in()
        collective = (f"waiting in {waiting}" if waiting is not None
                      else f"not in a collective (the last it issued: {self._last_issued() or 'none'})")
        return (f"{self.who} {HUNG} {waited:.0f} s {_where(work)}, {collective}; the bound was "
                f"{limit:.0f} s ({why}): a peer, its node or the link between them stopped responding")

    # --- the thread -------------------------------------------------------------------------
    def start(self, on_hang: Callable[[str], None]) -> None:
        if not self.settings.enabled:
            return

        def watch() -> None:
            while not self._stopped.wait(CHECK_SECONDS):
                message = self.check()
                if message is not None:
                    on_hang(message)
                    return

        self._thread = threading.Thread(target=watch, name="abtune-hang-detector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
