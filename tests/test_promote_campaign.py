"""A finished study promoted into a real campaign on a tiny ImageNet folder tree, run with the local
launcher at 1 and 2 simulated nodes, then `abtune report scaling`."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from abtune.runfiles import read_summary
from tests.conftest import CliResult, run_cli
from tests.promote_fixtures import BEST, BEST_RUN_ID, image_tree, single_objective_study, tiny_target

CARRIED = ("method.warmup_frac", "method.ab_frac", "method.rebound_frac", "method.lr_rebound_frac",
           "method.sigma_cutoff")
TRAIN_IMAGES = 48  # 3 classes x 16
EPOCHS = 4
PNG_MAGIC = b"\x89PNG"


@pytest.mark.slow
def test_promoted_campaign_runs_and_reports_every_run(tmp_path: Path, mlflow_db: Path,
                                                      abtune_main: Callable[..., CliResult]) -> None:
    """`promote` in this process (its installed command: tests/test_promote.py), `report scaling` through the
    installed `abtune`."""
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = single_objective_study(storage)
    data = image_tree(tmp_path / "imagenet")
    target = tiny_target(tmp_path / "target.yaml", data, epochs=EPOCHS)
    out = tmp_path / "campaign"
    result = abtune_main("promote", "tiny", "--storage", storage, "--top", "1", "--to", str(target), "--nodes", "1,2",
                         "--scaling", "local", "--campaign-dir", str(out), "--tracking-uri", f"sqlite:///{mlflow_db}")
    assert result.returncode == 0, result.stderr
    assert "4 of 4 runs finished" in result.stdout
    _check_mlflow_tags(f"sqlite:///{mlflow_db}", target)

    campaign = yaml.safe_load((out / "campaign.yaml").read_text())
    runs = {r["name"]: r for r in campaign["runs"]}
    assert list(runs) == ["n01-ddp", "n01-trial-2", "n02-ddp", "n02-trial-2"]
    best = optuna.load_study(study_name="tiny", storage=storage).trials[2]
    assert best.params == BEST and best.value == 0.90 and study.best_trial.user_attrs["reference"] == "ddp"
    for name, run in runs.items():
        summary = read_summary(out / run["run_dir"]).raw
        world = 2 * run["nodes"]
        assert summary["world_size"] == world and summary["num_nodes"] == run["nodes"]
        assert summary["steps_done"] == summary["steps"] == EPOCHS * (TRAIN_IMAGES // (4 * world)) == run["steps"]
        if name.endswith("ddp"):
            assert summary["method"] == "ddp" and run["promoted_from"] is None
            continue
        assert summary["method"] == "ab"
        assert {k: summary["config"][k] for k in CARRIED} == {k: best.params[k] for k in CARRIED}
        assert summary["config"]["optimizer.lr"] == 0.003  # the target's, not the trial's 0.004
        # not confirmed (`abtune study confirm` was not run): the campaign says so
        assert run["promoted_from"] == {"study": "tiny", "trial": 2, "values": [0.90], "mlflow_run_id": BEST_RUN_ID,
                                        "confirmed": None}
        assert summary["schedule"] == run["schedule"]  # the planned steps are the steps that ran

    report = run_cli("report", "scaling", str(out), "--tracking-uri", f"sqlite:///{mlflow_db}")
    assert "as in the paper's Table 1" in report.stdout
    _check_report_artifacts(f"sqlite:///{mlflow_db}")
    rows = {r["run"]: r for r in csv.DictReader((out / "scaling.csv").open())}
    assert set(rows) == set(runs) and all(r["status"] == "ok" for r in rows.values())
    for name, row in rows.items():
        summary = read_summary(out / runs[name]["run_dir"]).raw
        assert float(row["best_top1"]) == pytest.approx(summary["best_top1"])
        assert float(row["inter_node_gb_per_s"]) == pytest.approx(summary["traffic"]["training_inter_node_gb_per_s"])
        assert float(row["compression"]) == pytest.approx(summary["compression"]["method_ratio"])
        assert float(row["reduction_vs_ddp"]) == pytest.approx(summary["traffic"]["reduction_vs_ddp"])
    assert float(rows["n01-ddp"]["inter_node_gb_per_s"]) == 0.0  # one node: nothing crosses the interconnect
    assert float(rows["n02-ddp"]["inter_node_gb_per_s"]) > 0.0 and float(rows["n02-trial-2"]["inter_node_mb"]) > 0.0
    assert float(rows["n02-ddp"]["compression"]) == 1.0
    ab_summary = read_summary(out / runs["n02-trial-2"]["run_dir"]).raw
    assert len(ab_summary["compression_during_ab"]) == ab_summary["schedule"]["ab_cycles"] == 4  # AB really ran
    table1 = [line for line in report.stdout.splitlines() if line.startswith("| constant local batch")]
    assert [line.split("|")[2].strip() for line in table1] == ["1", "2"]
    assert (out / "scaling.png").read_bytes()[:4] == PNG_MAGIC
    assert (out / "scaling.md").read_text().count("| n0") == 4


def _check_mlflow_tags(tracking: str, target: Path) -> None:
    """Every campaign run is an MLflow run; the promoted ones name the trial and run they came from."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(f"scaling-{yaml.safe_load(target.read_text())['name']}")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"n01-ddp", "n01-trial-2", "n02-ddp", "n02-trial-2"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED" and run.data.metrics["best_top1"] > 0
        if "trial" in name:
            assert run.data.tags["abtune.promoted_from.study"] == "tiny"
            assert run.data.tags["abtune.promoted_from.trial"] == "2"
            assert run.data.tags["abtune.promoted_from.mlflow_run_id"] == BEST_RUN_ID
        else:
            assert "abtune.promoted_from.trial" not in run.data.tags


def _check_report_artifacts(tracking: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    reports = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 filter_string="tags.`abtune.role` = 'report'")
    assert len(reports) == 1
    files = {a.path: a.file_size for a in client.list_artifacts(reports[0].info.run_id, "report")}
    assert {"report/scaling.md", "report/scaling.csv", "report/scaling.png"} <= set(files), files
    assert all(size > 0 for size in files.values())
