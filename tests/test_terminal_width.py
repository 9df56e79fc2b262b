"""Every line a reader sees fits the terminal or wraps at words, at 80 and 100 columns, in a real pseudo-terminal:
`study best`, `study status`, `promote --dry-run` and `compare` (in this process, tests/terminal.py; the installed
`compare` in a terminal: tests/test_compare.py); only a command to copy may run past the edge."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import write_config
from tests.terminal import run_here_in_terminal, too_wide

VIT_TARGET = Path(__file__).resolve().parent.parent / "studies" / "imagenet_vit_b16.yaml"
# a command to copy (after its lead-in) stays one line; so does a batch script's line
COPYABLE = re.compile(r"^(\s*|.*: )(abtune|srun|sbatch|python|torchrun|#SBATCH|export) |^\s*\S+$")
WIDTHS = [80, 100]


def _overflow(lines: list[str], columns: int) -> list[str]:
    return [line for line in too_wide(lines, columns) if not COPYABLE.search(line)]


def _broken_words(lines: list[str]) -> list[str]:
    """Prose lines (not tables) that end inside a word joined by an underscore or a dot: cut, not wrapped."""
    return [line for line in lines if line[:1] not in "┏┃┡│└━" and re.search(r"[A-Za-z]+[_.]$", line.rstrip())]


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", [["study", "best"], ["study", "status"]])
def test_study_reports_fit_the_terminal(quickstart: tuple[Path, str], command: list[str], columns: int) -> None:
    folder, url = quickstart
    code, lines = run_here_in_terminal([*command, "quickstart", "--storage", url], columns, folder)
    assert code == 0, "\n".join(lines)
    assert _overflow(lines, columns) == [], "\n".join(lines)
    assert _broken_words(lines) == [], "\n".join(lines)


@pytest.mark.parametrize("columns", WIDTHS)
def test_promote_dry_run_fits_and_rounds_what_it_carries(quickstart: tuple[Path, str], columns: int) -> None:
    folder, url = quickstart
    code, lines = run_here_in_terminal(["promote", "quickstart", "--storage", url, "--to", str(VIT_TARGET), "--nodes",
                                   "2,4,8,16,32", "--scaling", "local", "--dry-run"], columns, folder)
    assert code == 0, "\n".join(lines)
    assert _overflow(lines, columns) == [], "\n".join(lines)
    text = "\n".join(lines)
    carried = text[text.index("trial-2 carries"):].split("\n\n")[0]  # the recommendation: within 0.01 of DDP
    assert "warmup_frac=0.1787" in carried and "(method.*)" in carried and "method.warmup_frac" not in carried
    assert "abtune: warning: the selection from study quickstart rests on a single run" in text


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80])
def test_compare_fits_and_ends_with_a_verdict(tmp_path: Path, columns: int) -> None:
    config = write_config(tmp_path / "run.yaml", train={"steps": 20, "local_batch_size": 16, "eval_every": 10})
    code, lines = run_here_in_terminal(["compare", str(config), "--methods", "ddp,sbc", "--nproc", "2",
                                        "--ranks-per-node", "1", "--out", str(tmp_path / "out"), "--no-tracking"],
                                       columns, tmp_path)
    assert code == 0, "\n".join(lines)
    assert _overflow(lines, columns) == [], "\n".join(lines)
    text = "\n".join(line.strip() for line in lines)
    assert "update compression: what sbc compresses each gradient update by" in " ".join(text.split())
    assert "verdict: " in text
