"""Hung ranks: a rank that makes no progress for too long ends its run in one line.

A dead link or a frozen peer leaves every rank waiting in a collective until the process group's
timeout (`train.pg_timeout_s`; gloo's own default is 30 minutes, NCCL's 10): on SLURM the job holds
its nodes, and its study worker, that long. So each rank times its own work, by kind (a step, an
evaluation, a checkpoint), and a thread of its own checks once a second that the work under way has
not run longer than `factor` times the longest of its kind so far, or `floor_s`, whichever is larger
(`untimed_s` for work with no time of its kind yet: set-up, the first step, evaluation or checkpoint,
the end of the run).

The rank that notices is rarely the one that hung: its peers wait for the one that stopped. So every
rank also publishes, once a second, what it is doing in the run's rendezvous store (a `ProgressBoard`),
and the rank that notices reads everyone's: the ranks it has not heard from for a while (frozen, or
behind a dead link), else those alive but outside any collective while others wait in one (a stalled
GPU or data loader), are named first, with their node, so a user knows which node to drain.

A hung rank writes one line (the ranks that stopped and their node, then itself: the work, its step and
phase, the collective it waits in) to the run's failures and ends its process at once. It must: the main thread is blocked inside a C++
collective, which nothing in Python can interrupt, and the check runs only because a collective
releases the GIL while it waits. The launcher then stops the other ranks (local: its poll; SLURM:
`srun --kill-on-bad-exit`), and a study retries the trial from its checkpoint like any failed one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

from abtune.config import HangConfig
from abtune.phases import Phase

CHECK_SECONDS = 1.0  # how often the work under way is checked, and progress published
HUNG = "made no progress for"  # in every hung rank's line: how a study tells a hang from other failures
BETWEEN = "between"  # the loop's own code between two timed pieces of work (logging, hooks)
# A rank publishes every CHECK_SECONDS; one not heard from for longer than this has stopped (frozen, or cut
# off). It is compared with other ranks' wall clocks: nodes whose clocks disagree by a second would blur it.
SILENT_S = 2.5
REPORT_AFTER_S = SILENT_S + CHECK_SECONDS  # a frozen peer is silent for longer than SILENT_S by then
READ_TIMEOUT_S = 5.0  # the rendezvous store's answer; none means its rank, node or the link to it stopped
# Rank 0 serves the store: a hung rank 0 ends only once its peers have stopped using it (a store that dies
# under a peer still publishing or reading makes c10d print a stack on the terminal), or after the hang floor
# (train.hang.floor_s) and this much again, in case a peer outlives it; the launcher or srun ends it sooner, as
# soon as another rank has ended.
STORE_LINGER_S = REPORT_AFTER_S + 2 * CHECK_SECONDS
UNKNOWN_CAUSE = "a peer, its node or the link between them stopped responding"


@dataclass(frozen=True)
class Work:
    kind: str  # set-up, step, evaluation, checkpoint, end, between
    step: int
    phase: str
    started: float


@dataclass(frozen=True)
class RankId:
    rank: int
    node: int
    host: str = ""  # the node's name (SLURM's), shown when the run's nodes have different ones

    def describe(self, show_host: bool = False) -> str:
        host = f", host {self.host}" if show_host and self.host else ""
        return f"rank {self.rank} (node {self.node}{host})"


@dataclass(frozen=True)
class Heard:
    """What a rank last published: who, when (wall clock), how long its work had run, where it was."""

    rank: int
    node: int
    host: str
    at: float
    busy_s: float
    where: str
    waiting_in: str | None
    noticed: bool = False  # this rank is reporting a hang itself (and about to end): not a culprit

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Heard:
        return cls(**json.loads(text))

    def silent(self, now: float) -> bool:
        """Not heard from for longer than SILENT_S at wall-clock `now`: ended, frozen or cut off."""
        return now - self.at > SILENT_S


class ProgressBoard(Protocol):
    """Where each rank publishes its progress and the rank that notices a hang reads everyone's (abtune/dist.py:
    the run's rendezvous store). Either call may block behind a stopped peer or link: the detector makes them
    from threads it can leave behind."""

    def publish(self, rank: int, record: str) -> None: ...

    def read(self) -> list[str | None]:
        """Every rank's last record, in rank order; None for a rank that has published none."""
        ...


@dataclass(frozen=True)
class Overrun:
    """Work of this rank that ran past its bound."""

    work: Work
    waited: float
    limit: float
    why: str
    collective: str

    def line(self, me: RankId, show_host: bool = False) -> str:
        """This rank's own account: the work that overran, what it waits in, the bound."""
        return (f"{me.describe(show_host)} {HUNG} {self.waited:.0f} s {_where(self.work)}, {self.collective}; the "
                f"bound was {self.limit:.0f} s ({self.why})")

    def alone(self, me: RankId, cause: str = UNKNOWN_CAUSE) -> str:
        """The line when nothing tells which peer stopped."""
        return f"{self.line(me)}: {cause}"


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


# --- who stopped ------------------------------------------------------------------------------
def describe_hang(overrun: Overrun, me: RankId, heard: Sequence[Heard | None] | None, now: float) -> str:
    """The one line: the ranks that stopped, from every rank's last record (`heard`, in rank order; None: the
    store did not answer), then this rank and what it waited for."""
    if heard is None:
        return overrun.alone(me, f"rank 0 (node 0), which holds the rendezvous store, did not answer in "
                                 f"{READ_TIMEOUT_S:g} s: it, its node or the link to it stopped responding")
    known = [h for h in heard if h is not None]
    never = [rank for rank, h in enumerate(heard) if h is None]
    silent = [h for h in known if not h.noticed and h.silent(now)]
    culprits = silent or ([] if never else _outside_collectives(known))
    if not culprits and not never:
        return overrun.alone(me)
    show_host = len({h.host for h in known}) > 1
    if silent:
        quiet = max(now - h.at for h in silent)
        culprit = (f"{' and '.join(_name_ranks(silent, known, show_host))} stopped responding: not heard from for "
                   f"{quiet:.0f} s, last {silent[0].where}")
    elif culprits:
        busy = max(now - h.at + h.busy_s for h in culprits)
        culprit = (f"{' and '.join(_name_ranks(culprits, known, show_host))} held the others up: {busy:.0f} s "
                   f"{culprits[0].where}, outside any collective while others wait in one")
    else:
        culprit = f"rank(s) {', '.join(map(str, never))} never published their progress"
    return f"{culprit}; {overrun.line(me, show_host)}"


def _outside_collectives(known: Sequence[Heard]) -> list[Heard]:
    """Ranks alive but outside any collective while others wait in one: they hold the others up. (DDP's
    gradient all-reduce runs unseen by the meter, so a DDP run never shows anyone waiting: nothing is told.)"""
    alive = [h for h in known if not h.noticed]
    if not any(h.waiting_in for h in alive):
        return []
    return [h for h in alive if h.waiting_in is None]


def _name_ranks(culprits: Sequence[Heard], known: Sequence[Heard], show_host: bool) -> list[str]:
    """`rank 3 (node 1, host n2)`, or `node 1 (ranks 2, 3)` when every rank of the node is among them."""
    by_node: dict[int, list[Heard]] = {}
    for heard in sorted(culprits, key=lambda h: h.rank):
        by_node.setdefault(heard.node, []).append(heard)
    parts = []
    for node, ranks in sorted(by_node.items()):
        numbers = ", ".join(str(h.rank) for h in ranks)
        host = f", host {ranks[0].host}" if show_host and ranks[0].host else ""
        if len(ranks) > 1 and len(ranks) == sum(1 for h in known if h.node == node):
            parts.append(f"node {node} (ranks {numbers}{host})")
        else:
            parts.append(f"rank{'s' if len(ranks) > 1 else ''} {numbers} (node {node}{host})")
    return parts


class HangDetector:
    """Times a rank's work and calls `on_hang` with the one line when the work under way overruns.

    `waiting_in`: the collective this rank is blocked in, if any (the meter's `waiting_in`), and
    `last_issued` the last it started; both are read from the checking thread.
    """

    def __init__(self, settings: HangConfig, me: RankId, waiting_in: Callable[[], str | None],
                 last_issued: Callable[[], str | None], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.me = me
        self._waiting_in = waiting_in
        self._last_issued = last_issued
        self._clock = clock
        self._wall = wall
        self._longest: dict[str, float] = {}
        self._work = Work("set-up", 0, Phase.SETUP.value, clock())
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._publish_now = threading.Event()
        self._noticed = False
        self._threads: list[threading.Thread] = []

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

    def overrun(self) -> Overrun | None:
        """The work under way when it has run past its bound, else None."""
        with self._lock:
            work = self._work
            waited = self._clock() - work.started
            limit, why = self.bound(work.kind)
        if waited <= limit:
            return None
        waiting = self._waiting_in()
        collective = (f"waiting in {waiting}" if waiting is not None
                      else f"not in a collective (the last it issued: {self._last_issued() or 'none'})")
        return Overrun(work, waited, limit, why, collective)

    def check(self) -> str | None:
        """The one line, from this rank's view alone, when the work under way has overrun its bound, else None."""
        overrun = self.overrun()
        return None if overrun is None else overrun.alone(self.me)

    def heard(self) -> Heard:
        """What this rank publishes about itself."""
        with self._lock:
            work = self._work
        return Heard(self.me.rank, self.me.node, self.me.host, self._wall(), self._clock() - work.started,
                     _where(work), self._waiting_in(), self._noticed)

    def explain(self, overrun: Overrun, board: ProgressBoard) -> str:
        """The one line, naming the ranks that stopped from what every rank last published on `board`."""
        self._noticed = True
        self._publish_now.set()
        time.sleep(max(0.0, REPORT_AFTER_S - (self._clock() - overrun.work.started)))
        return describe_hang(overrun, self.me, _read(board), self._wall())

    # --- the threads ------------------------------------------------------------------------
    def start(self, on_hang: Callable[[str], None], board: ProgressBoard | None = None) -> None:
        """Check once a second; with a `board`, also publish this rank's progress on it once a second."""
        if not self.settings.enabled:
            return

        def watch() -> None:
            while not self._stopped.wait(CHECK_SECONDS):
                overrun = self.overrun()
                if overrun is not None:
                    on_hang(overrun.alone(self.me) if board is None else self.explain(overrun, board))
                    return

        def publish() -> None:
            assert board is not None
            while not self._stopped.is_set():
                try:
                    board.publish(self.me.rank, self.heard().to_json())
                except Exception:  # noqa: BLE001 - the store went away (the run is ending): nothing to tell
                    return
                self._publish_now.wait(CHECK_SECONDS)
                self._publish_now.clear()

        self._threads = [threading.Thread(target=watch, name="abtune-hang-detector", daemon=True)]
        if board is not None:
            # its own thread: a publication stuck behind a dead link must not stop the checks
            self._threads.append(threading.Thread(target=publish, name="abtune-progress", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._publish_now.set()
        for thread in self._threads:
            thread.join(timeout=None if thread.name == "abtune-hang-detector" else CHECK_SECONDS)


def until_peers_leave(board: ProgressBoard, me: int, limit_s: float) -> None:
    """Return once no rank but `me` has published for SILENT_S (each has ended, or is frozen), or after `limit_s`.
    A peer that noticed the hang too reads the board and ends; one that has not yet keeps publishing."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        heard = _read(board)
        if heard is None:
            return
        now = time.time()
        if all(peer.silent(now) for rank, peer in enumerate(heard) if rank != me and peer is not None):
            return
        time.sleep(CHECK_SECONDS)


def _read(board: ProgressBoard) -> list[Heard | None] | None:
    """Every rank's last record on `board` (None: none published), or None when the store gives no answer
    within READ_TIMEOUT_S."""
    records = _within(READ_TIMEOUT_S, board.read)
    return None if records is None else [None if r is None else Heard.from_json(r) for r in records]


def _within(seconds: float, read: Callable[[], list[str | None]]) -> list[str | None] | None:
    """`read()`'s answer, or None when it gives none within `seconds` (the thread is left blocked: the
    process is about to end)."""
    answer: list[list[str | None]] = []

    def ask() -> None:
        try:
            answer.append(read())
        except Exception:  # noqa: BLE001 - a store that refuses tells as much as one that is silent
            return

    reader = threading.Thread(target=ask, name="abtune-progress-read", daemon=True)
    reader.start()
    reader.join(seconds)
    return answer[0] if answer else None
