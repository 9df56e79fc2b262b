"""Campaign bookkeeping and `abtune report scaling` without training: a launcher stand-in writes
what a finished or failed run leaves behind."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from abtune.cli import main
from abtune.launch.base import Job, Launcher, Layout
from abtune.launch.outcome import RunOutcome
from abtune.promote.campaign import read_campaign, run_campaign, run_tags, write_campaign
from abtune.promote.plan import plan_campaign
from abtune.promote.select import Promoted, Source
from abtune.promote.target import load_target
from tests.promote_fixtures import tiny_target

PROMOTED = [Promoted("trial-7", {"method.sigma_cutoff": 0.3}, Source("s", 7, (0.9,), "run42"))]
SAMPLES = 64
PNG_MAGIC = b"\x89PNG"


class FinishedJob(Job):
    kind = "instant"

    def __init__(self, outcome: RunOutcome, run_dir: Path) -> None:
        super().__init__("0", run_dir)
        self.outcome = outcome

    def poll(self) -> RunOutcome:
        return self.outcome

    def cancel(self) -> None:
        pass


class InstantLauncher(Launcher):
    """Finishes every run at once with made-up traffic; the AB run on 2 nodes fails."""

    kind = "local"

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        return Layout(1, 1)

    def submit(self, run_dir: Path, layout: Layout, **_: object) -> FinishedJob:
        return FinishedJob(fake_outcome(run_dir, layout), run_dir)


def fake_outcome(run_dir: Path, layout: Layout) -> RunOutcome:
    if layout.nodes == 2 and "trial" in run_dir.name:
        return RunOutcome(False, "rank 3 was killed by SIGKILL", 1)
    ab = "trial" in run_dir.name
    gbs = 0.0 if layout.nodes == 1 else (1.0 if ab else 2.5) * layout.nodes
    summary = {"best_top1": 0.5 + 0.1 * layout.nodes, "final": {"val_top1": 0.5},
               "traffic": {"training_inter_node_gb_per_s": gbs, "training_inter_node_bytes": gbs * 1e9,
                           "reduction_vs_ddp": 2.0 if ab else 1.0},
               "compression": {"method_ratio": 1.5 if ab else 1.0}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return RunOutcome(True)


def campaign_dir(tmp_path: Path, strategy: str) -> Path:
    target = load_target(tiny_target(tmp_path / "target.yaml", tmp_path / "data"))
    campaign, configs = plan_campaign(target, "target.yaml", PROMOTED, (1, 2, 4), strategy, SAMPLES)  # type: ignore[arg-type]
    out = tmp_path / strategy
    write_campaign(out, campaign, configs)
    outcomes = run_campaign(out, campaign, InstantLauncher(None), show_progress=False)
    assert [o.ok for o in outcomes.values()] == [True, True, True, False, True, True]  # the others went on
    return out


def test_report_shows_table1_per_strategy_and_failed_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local, global_ = campaign_dir(tmp_path, "local"), campaign_dir(tmp_path, "global")
    assert [r.global_batch_size for r in read_campaign(local).runs[::2]] == [8, 16, 32]
    assert [r.local_batch_size for r in read_campaign(global_).runs[::2]] == [8, 4, 2]
    assert main(["report", "scaling", str(local), str(global_), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "| constant local batch | 2 | 5.000000 | failed |" in out
    assert "| constant local batch | 4 | 10.000000 | 4.000000 |" in out
    assert "| constant global batch | 1 | 0.000000 | 0.000000 |" in out
    assert "failed: rank 3 was killed by SIGKILL" in out
    rows = list(csv.DictReader((tmp_path / "report" / "scaling.csv").open()))
    assert len(rows) == 12 and {r["strategy"] for r in rows} == {"local", "global"}
    ab4 = next(r for r in rows if r["run"] == "n04-trial-7" and r["strategy"] == "local")
    assert (float(ab4["compression"]), float(ab4["reduction_vs_ddp"]), ab4["promoted_from"]) == (1.5, 2.0, "s #7")
    assert (tmp_path / "report" / "scaling.png").read_bytes()[:4] == PNG_MAGIC


def test_a_campaign_folder_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = campaign_dir(tmp_path, "local")
    target = load_target(tiny_target(tmp_path / "target.yaml", tmp_path / "data"))
    campaign, configs = plan_campaign(target, "target.yaml", PROMOTED, (1,), "local", SAMPLES)
    with pytest.raises(Exception, match="is not empty; choose another --campaign-dir"):
        write_campaign(out, campaign, configs)
    assert main(["report", "scaling", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"abtune: error: {tmp_path}: no campaign.yaml; "
                                               "pass a folder written by `abtune promote`")


def test_runs_are_tagged_with_the_trial_and_run_they_came_from(tmp_path: Path) -> None:
    runs = read_campaign(campaign_dir(tmp_path, "local")).runs
    assert run_tags(runs[1]) == {"abtune.campaign_run": "n01-trial-7", "abtune.nodes": "1", "abtune.method": "ab",
                                 "abtune.promoted_from.study": "s", "abtune.promoted_from.trial": "7",
                                 "abtune.promoted_from.mlflow_run_id": "run42"}
    assert "abtune.promoted_from.study" not in run_tags(runs[0])
