"""What rank 0 shows while training: a progress bar and one table row per evaluation."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

MEGA = 1e6
ROW_FORMAT = "{:>6} {:>5} {:>7} {:>7} {:>6} {:>5} {:>9} {:>11} {:>9}"
# compr: the model being trained (AB: its latest AB phase); dense:cur: dense / current parameters;
# train inter: training phases' inter-node MB; all inter: every phase's (evaluations, set-up included).
HEADER = ROW_FORMAT.format("step", "epoch", "phase", "loss", "top1", "compr", "dense:cur", "train inter",
                           "all inter")


class ProgressReporter:
    """Silent on ranks other than 0. The bar shows only on a terminal; rows are always printed."""

    def __init__(self, active: bool, total_steps: int, label: str = "train") -> None:
        self.active = active
        self.console = Console(highlight=False)
        self.total_steps = total_steps
        self._loss_sum = 0.0
        self._loss_count = 0
        self._header_shown = False
        self._progress = Progress(
            TextColumn(f"[bold]{escape(label)}[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[phase]:>8}"),
            TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, disable=not (active and self.console.is_terminal), transient=True,
        )
        self._task = self._progress.add_task("train", total=total_steps, phase="", loss=float("nan"))

    def __enter__(self) -> ProgressReporter:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def step(self, step: int, loss: float, phase: str) -> None:
        self._loss_sum += loss
        self._loss_count += 1
        self._progress.update(self._task, completed=step, phase=phase, loss=loss)

    def mean_loss(self) -> float:
        """Mean training loss (this rank) since the previous evaluation."""
        mean = self._loss_sum / self._loss_count if self._loss_count else float("nan")
        self._loss_sum, self._loss_count = 0.0, 0
        return mean

    def evaluation(self, row: dict[str, Any]) -> None:
        if not self.active:
            return
        if not self._header_shown:
            self.console.print(HEADER)
            self._header_shown = True
        self.console.print(
            ROW_FORMAT.format(
                row["step"], f"{row['epoch']:.1f}", row["phase"], f"{row['loss']:.4f}", f"{row['val_top1']:.4f}",
                f"{row['model_compression']:.2f}", f"{row['dense_over_current']:.2f}",
                f"{row['training_inter_node_bytes'] / MEGA:.2f}", f"{row['inter_node_bytes'] / MEGA:.2f}",
            )
        )

    def note(self, message: str) -> None:
        if self.active:
            self.console.print(message, soft_wrap=True)

    def state_dict(self) -> dict[str, Any]:
        return {"loss_sum": self._loss_sum, "loss_count": self._loss_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loss_sum, self._loss_count = state["loss_sum"], state["loss_count"]
