"""`abtune study confirm` on a real pseudo-terminal (in the test's process) at 80 and 100 columns: a progress bar
while its runs train (no line per finished run), then the project's tables (not markdown), and no line wider than
the terminal except a command to copy."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.study import lifecycle
from tests.study_helpers import TINY_BASE, write_study
from tests.terminal import run_here_in_terminal, tables_in
from tests.test_terminal_width import WIDTHS, _broken_words, _overflow

pytestmark = pytest.mark.slow
SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.sigma_cutoff": FloatDistribution(0.01, 0.5, log=True)}
# (params, reference, top-1, inter-node bytes): the paper's defaults, DDP, one searched trial
TRIALS = [({"method.warmup_frac": 0.2, "method.sigma_cutoff": 0.1}, "paper-defaults", 0.50, 4.0e6),
          ({}, "ddp", 0.52, 9.0e6),
          ({"method.warmup_frac": 0.15, "method.sigma_cutoff": 0.2}, None, 0.51, 3.0e6)]
SEEDS = 2


@pytest.fixture(scope="module")
def stored_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny study whose three trials are stored, not trained: confirming it trains 3 x SEEDS runs of two steps
    (what the tables show needs a run's final evaluation, not its learning)."""
    folder = tmp_path_factory.mktemp("confirm-terminal")
    url = f"sqlite:///{folder / 'optuna.db'}"
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "steps": 2, "eval_every": 1000}}
    spec = write_study(folder / "s.yaml", base=base, trials=3, objectives=["top1", "inter_node_bytes"],
                       study_dir=str(folder / "trials"), references={"paper_defaults": False, "ddp": False})
    lifecycle.create(spec, None, url, force=False)
    study = optuna.load_study(study_name="tiny", storage=url)
    for params, reference, top1, nbytes in TRIALS:
        attrs = {"top1": top1, "inter_node_bytes": nbytes, "compression": 1.0,
                 **({"reference": reference} if reference else {})}
        study.add_trial(create_trial(params=params, distributions={k: SPACE[k] for k in params},
                                     values=[top1, nbytes], user_attrs=attrs))
    return folder, url


@pytest.mark.parametrize("columns", WIDTHS)  # the first width trains the runs, the second finds them done
def test_confirm_shows_a_progress_bar_then_tables_that_fit(stored_study: tuple[Path, str], columns: int) -> None:
    folder, url = stored_study
    code, lines = run_here_in_terminal(["study", "confirm", "tiny", "--top", "1", "--seeds", str(SEEDS), "--storage",
                                        url, "--no-tracking"], columns, folder, rows=60)
    shown = "\n".join(lines)
    assert code == 0, shown
    assert _overflow(lines, columns) == [], shown
    assert _broken_words(lines) == [], shown
    assert not [line for line in lines if line.rstrip().endswith(": done")], shown  # the bar, not a line per run
    bars = [line for line in lines if line.startswith("confirming ━")]
    if columns == WIDTHS[0]:
        assert bars and f"{3 * SEEDS}/{3 * SEEDS}" in bars[-1] and "running" not in bars[-1], shown
    else:
        assert f"0 runs to train, {3 * SEEDS} already done" in " ".join(shown.split()), shown
        assert bars == [], shown  # nothing to train: no bar
    assert "| --- " not in shown and "###" not in shown  # no markdown on the terminal
    titles = [table.title for table in tables_in(lines)]
    assert any("top1" in title for title in titles) and any("inter_node_bytes" in title for title in titles), titles
    for table in tables_in(lines):
        assert table.headers[0] == "configuration" and {row[0] for row in table.rows} >= {"trial 2"}, table
