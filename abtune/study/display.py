"""What `abtune study run` shows: a progress bar over the study's budget and a table of finished trials.

On a terminal both live in one rich Live view; otherwise (logs, CI) one line per event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from abtune.attrs import FAIL_REASON_ATTR, RETRIED_ATTR
from abtune.study import results
from abtune.study.spec import StudySpec

MEGA = 1e6
SHOWN_ROWS = 15


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
    def __init__(self, name: str, spec: StudySpec) -> None:
        self.console = Console(highlight=False)
        self.spec = spec
        self.live_mode = self.console.is_terminal
        self.rows: list[list[str]] = []
        self.progress = Progress(TextColumn(f"[bold]study {name}[/]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[running]}"), TimeElapsedColumn(), console=self.console)
        self.task = self.progress.add_task("trials", total=spec.trials, running="")
        self.live = Live(self._view(), console=self.console, refresh_per_second=4, transient=False)
        self.running: set[int] = set()

    def __enter__(self) -> RunDisplay:
        if self.live_mode:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live_mode:
            self.live.__exit__(*exc)

    def _view(self) -> Any:
        table = Table("trial", "state", "top1", "inter MB", "wall s", "note", title="finished trials")
        for row in self.rows[-SHOWN_ROWS:]:
            table.add_row(*row)
        return Group(self.progress, table)

    def _update(self) -> None:
        running = f"running: {', '.join(map(str, sorted(self.running)))}" if self.running else ""
        self.progress.update(self.task, running=running)
        if self.live_mode:
            self.live.update(self._view())

    def refresh(self, trials: Sequence[FrozenTrial]) -> None:
        self.progress.update(self.task, completed=results.finished_count(trials))
        self._update()

    def started(self, number: int, reference: str | None) -> None:
        self.running.add(number)
        if not self.live_mode:
            self.console.print(f"trial {number} started" + (f" ({reference} reference)" if reference else ""))
        self._update()

    def reattached(self, number: int, how: str) -> None:
        """A trial that started under an earlier worker, followed from here on."""
        self.running.add(number)
        self.console.print(f"trial {number}: {how}")
        self._update()

    def finished(self, trial: FrozenTrial, trials: Sequence[FrozenTrial]) -> None:
        self.running.discard(trial.number)
        row = trial_row(trial)
        self.rows.append(row)
        if not self.live_mode:
            self.console.print(finished_line(trial, row), markup=False)  # a fail reason may hold [brackets]
        self.refresh(trials)

    def note(self, text: str) -> None:
        self.console.print(text)
