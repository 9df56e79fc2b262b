"""What `abtune study run` shows: a progress bar over the study's budget with the study's ETA, each running
trial's step, phase and ETA, the current Pareto front and a table of finished trials.

On a terminal all of it lives in one rich Live view, refreshed as the runner polls; otherwise (logs, CI)
one line per event. A running trial's step and phase are read from the last lines of its metrics.jsonl;
its ETA from the pace between the first step seen and the latest, the study's from the finished trials'
mean wall time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from abtune.attrs import FAIL_REASON_ATTR, RETRIED_ATTR
from abtune.runfiles import METRICS_FILE
from abtune.study import results
from abtune.study.spec import StudySpec

MEGA = 1e6
SHOWN_ROWS = 15
TAIL_BYTES = 8192  # of metrics.jsonl: enough for its last log record


@dataclass
class Pace:
    """A running trial as the live view follows it: the first step seen (and when), the latest and its phase."""

    first_step: int = 0
    first_at: float | None = None  # None: no step seen yet
    step: int = 0
    phase: str = "starting"
    at: float = 0.0

    def seen(self, step: int, phase: str, now: float) -> None:
        if self.first_at is None:
            self.first_step, self.first_at = step, now
        self.step, self.phase, self.at = step, phase, now

    def eta_s(self, total: int | None) -> float | None:
        """Seconds to `total` steps at the pace seen so far (None before two steps apart were seen)."""
        if total is None or self.first_at is None or self.step <= self.first_step:
            return None
        return (total - self.step) * (self.at - self.first_at) / (self.step - self.first_step)


def last_log(run_dir: Path | None) -> dict[str, Any] | None:
    """The last `log` record of a run's metrics.jsonl (a trial with seed repeats: its first seed's; None before
    the first record)."""
    if run_dir is None:
        return None
    path = next((p for p in [run_dir / METRICS_FILE, *sorted(run_dir.glob(f"*/{METRICS_FILE}"))] if p.exists()), None)
    if path is None:
        return None
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        lines = handle.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the first, cut line of the tail, or one being written
            continue
        if record.get("kind") == "log":
            return record
    return None


def duration(seconds: float | None) -> str:
    """`1h 02m`, `3m 20s`, `45s`; `-` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    whole = max(0, round(seconds))
    if whole >= 3600:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 60}m {whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def with_spread(value: str, attrs: dict[str, Any], key: str, scale: float = 1.0) -> str:
    """`value ± std` when the trial ran several seeds (`repeats`), with as many digits as `value`."""
    spread = attrs.get(f"{key}_std")
    if spread is None or not math.isfinite(spread):
        return value
    digits = len(value.rpartition(".")[2]) if "." in value else 0
    return f"{value} ± {spread / scale:.{digits}f}"


def trial_row(trial: FrozenTrial) -> list[str]:
    attrs = trial.user_attrs
    top1 = with_spread(f"{attrs['top1']:.4f}", attrs, "top1") if "top1" in attrs else "-"
    inter = with_spread(f"{attrs['inter_node_bytes'] / MEGA:.2f}", attrs, "inter_node_bytes", MEGA) \
        if "inter_node_bytes" in attrs else "-"
    seconds = f"{attrs['wall_seconds']:.0f}" if "wall_seconds" in attrs else "-"
    note = attrs.get(FAIL_REASON_ATTR, "") if trial.state == TrialState.FAIL else results.label(trial)
    return [str(trial.number), trial.state.name, top1, inter, seconds, note]


def finished_line(trial: FrozenTrial, row: list[str]) -> str:
    if trial.state == TrialState.FAIL:  # no figures to show: the cause, and whether it runs again
        retried = ", retried" if trial.user_attrs.get(RETRIED_ATTR) else ""
        return f"trial {trial.number} FAIL{retried}: {row[-1]}"
    return "trial {} {}: top1 {} inter-node MB {} wall {} s {}".format(*row).rstrip()


class RunDisplay:
    def __init__(self, name: str, spec: StudySpec, parallel: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = Console(highlight=False)
        self.spec = spec
        self.parallel = max(1, parallel)
        self.clock = clock
        self.live_mode = self.console.is_terminal
        self.rows: list[list[str]] = []
        self.total_steps: int | None = spec.base.get("train", {}).get("steps")
        self.progress = Progress(TextColumn(f"[bold]study {name}[/]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[eta]}"), TimeElapsedColumn(), console=self.console)
        self.task = self.progress.add_task("trials", total=spec.trials, eta="")
        self.running: dict[int, Pace] = {}
        self.front = ""
        self.walls: list[float] = []  # finished trials' wall seconds
        self.finished_count = 0
        self.live = Live(self._view(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> RunDisplay:
        if self.live_mode:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live_mode:
            self.live.__exit__(*exc)

    def _view(self) -> Any:
        parts: list[Any] = [self.progress]
        if self.running:
            running = Table("trial", "step", "phase", "ETA", title="running trials", title_justify="left")
            for number, pace in sorted(self.running.items()):
                steps = f"{pace.step}/{self.total_steps}" if self.total_steps else str(pace.step)
                running.add_row(str(number), steps if pace.first_at is not None else "-", pace.phase, duration(pace.eta_s(self.total_steps)))
            parts.append(running)
        if self.front:
            parts.append(Text(self.front))
        table = Table("trial", "state", "top1", "inter MB", "wall s", "note", title="finished trials")
        for row in self.rows[-SHOWN_ROWS:]:
            table.add_row(*row)
        parts.append(table)
        return Group(*parts)

    def study_eta_s(self) -> float | None:
        """The running trials' longest ETA, then the trials not started yet in waves of `parallel`, each as long
        as a finished trial on average (None before one finished)."""
        if not self.walls:
            return None
        waiting = max(0, self.spec.trials - self.finished_count - len(self.running))
        running = [eta for pace in self.running.values() if (eta := pace.eta_s(self.total_steps)) is not None]
        mean = sum(self.walls) / len(self.walls)
        return max(running, default=0.0) + math.ceil(waiting / self.parallel) * mean

    def _update(self) -> None:
        eta = self.study_eta_s()
        self.progress.update(self.task, eta="" if eta is None else f"ETA {duration(eta)}")
        if self.live_mode:
            self.live.update(self._view())

    def refresh(self, trials: Sequence[FrozenTrial]) -> None:
        self.finished_count = results.finished_count(trials)
        self.walls = [t.user_attrs["wall_seconds"] for t in trials
                      if t.state == TrialState.COMPLETE and "wall_seconds" in t.user_attrs]
        front = results.pareto_front(results.search_trials(trials), self.spec.objectives)
        self.front = f"current front: trial {', '.join(str(t.number) for t in front)}" if front else ""
        self.progress.update(self.task, completed=self.finished_count)
        self._update()

    def watch(self, run_dirs: dict[int, Path | None]) -> None:
        """The running trials' step and phase, from their run folders (on a terminal only: logs get events)."""
        if not self.live_mode:
            return
        now = self.clock()
        for number, run_dir in run_dirs.items():
            record = last_log(run_dir)
            if record is not None and number in self.running:
                self.running[number].seen(int(record["step"]), str(record.get("phase", "")), now)
        self._update()

    def started(self, number: int, reference: str | None) -> None:
        self.running[number] = Pace()
        if not self.live_mode:
            self.console.print(f"trial {number} started" + (f" ({reference} reference)" if reference else ""))
        self._update()

    def reattached(self, number: int, how: str) -> None:
        """A trial that started under an earlier worker, followed from here on."""
        self.running[number] = Pace()
        self.console.print(f"trial {number}: {how}")
        self._update()

    def finished(self, trial: FrozenTrial, trials: Sequence[FrozenTrial]) -> None:
        self.running.pop(trial.number, None)
        row = trial_row(trial)
        self.rows.append(row)
        if not self.live_mode:
            self.console.print(finished_line(trial, row), markup=False)  # a fail reason may hold [brackets]
        self.refresh(trials)

    def note(self, text: str) -> None:
        self.console.print(text)
