"""The loss axis of a run's accuracy plot is logarithmic; its tick labels are plain numbers, also where the
loss spans less than a decade and minor ticks get labels (matplotlib's default wrote them as 2.306x10^0)."""

from __future__ import annotations

from pathlib import Path

from abtune.tracking import plots


def test_a_loss_within_one_decade_is_labelled_in_plain_numbers(tmp_path: Path) -> None:
    records = [{"kind": "log", "step": s, "loss": 2.4 - 0.002 * s} for s in range(0, 100, 10)]
    records += [{"kind": "evaluation", "step": s, "val_top1": 0.1, "val_top5": 0.3, "val_loss": 2.35 - 0.001 * s}
                for s in (50, 99)]
    drawn = plots.accuracy_and_loss(records, [("train", 0, 100)], tmp_path / "acc.png", "trial-0")
    assert not any("$" in text or "times" in text for text in drawn.texts), drawn.texts
    assert any(text.startswith("2.") for text in drawn.texts), drawn.texts  # the minor ticks are labelled


def test_a_loss_over_decades_is_labelled_at_each_power_of_ten_in_plain_numbers(tmp_path: Path) -> None:
    records = [{"kind": "log", "step": s, "loss": 3.0 * 0.9 ** s} for s in range(0, 40, 2)]
    drawn = plots.accuracy_and_loss(records, [("train", 0, 40)], tmp_path / "acc.png", "trial-0")
    assert {"0.1", "1"} <= set(drawn.texts), drawn.texts
    assert not any("$" in text or "e-" in text or "e\u2212" in text for text in drawn.texts), drawn.texts
