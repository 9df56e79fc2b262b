"""Training hooks: the metrics file every run writes, and a hook that stops all ranks early (as pruning does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abtune.runfiles import read_summary
from abtune.training.hooks import TrainingHook, hook_spec, read_metrics, write_hook_specs
from tests.conftest import run_cli, write_config

pytestmark = pytest.mark.slow


class StopAt(TrainingHook):
    def __init__(self, run_dir: Path, step: int) -> None:
        self.step = step
        self.seen = run_dir / "hook_seen.json"

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        return "pruned by the test" if row["step"] >= self.step else None

    def on_end(self, summary: dict[str, Any]) -> None:
        self.seen.write_text(json.dumps({"steps_done": summary["steps_done"]}))


def stop_at(run_dir: Path, step: int) -> StopAt:
    return StopAt(run_dir, step)


def test_a_hook_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", train={"steps": 40, "eval_every": 10, "log_every": 5})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_hook_specs(run_dir, [hook_spec(stop_at, step=20)])
    run_cli("train", str(config), "--nproc", "2", "--run-dir", str(run_dir), "--no-tracking")

    summary = read_summary(run_dir).raw
    assert summary["steps_done"] == 20
    assert summary["stopped_early"] == "pruned by the test"
    assert [h["step"] for h in summary["history"]] == [10, 20]
    assert json.loads((run_dir / "hook_seen.json").read_text()) == {"steps_done": 20}
    # the decision itself crossed the wire: one byte broadcast per evaluation before the stop
    assert summary["traffic"]["by_phase"]["control"]["total"]["mean"] == pytest.approx(2 * 1 * 0.5)

    records = read_metrics(run_dir)
    logs = [r for r in records if r["kind"] == "log"]
    assert [r["step"] for r in logs] == [5, 10, 15, 20]
    assert all(r["lr"] > 0 and r["step_seconds"] > 0 for r in logs)
    assert logs[-1]["total_bytes"] > logs[0]["total_bytes"]
    assert [r["step"] for r in records if r["kind"] == "evaluation"] == [10, 20]
    assert records[-1]["kind"] == "summary"


def test_every_run_writes_metrics_and_a_full_run_ends_with_its_last_step(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", train={"steps": 12, "eval_every": 6, "log_every": 5})
    run_dir = tmp_path / "run"
    run_cli("train", str(config), "--nproc", "2", "--run-dir", str(run_dir), "--no-tracking")
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r["kind"] == "log"] == [5, 10, 12]
    assert [r["step"] for r in records if r["kind"] == "evaluation"] == [6, 12]
    summary = read_summary(run_dir).raw
    assert summary["stopped_early"] is None and summary["steps_done"] == 12
    assert "control" not in summary["traffic"]["by_phase"]


def test_a_hook_that_cannot_be_loaded_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """The run lifecycle resolves hooks.yaml in the launching process: a factory that does not import is
    one line and exit 2, and no rank ran (nothing in metrics.jsonl, no summary)."""
    config = write_config(tmp_path / "run.yaml", train={"steps": 10})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_hook_specs(run_dir, [{"factory": "tests.no_such_module:make_hook", "options": {}}])
    result = run_cli("train", str(config), "--nproc", "2", "--run-dir", str(run_dir), "--no-tracking", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"abtune: error: {run_dir / 'hooks.yaml'}: cannot load hook 'tests.no_such_module:make_hook': "
        "No module named 'tests.no_such_module'"]
    assert not (run_dir / "summary.json").exists() and not read_metrics(run_dir)
