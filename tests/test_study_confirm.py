"""`abtune study confirm` on a real study: the table against the seed runs' own summaries."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from abtune.attrs import DDP, PAPER_DEFAULTS
from abtune.runfiles import read_summary
from abtune.study import results
from tests.conftest import CliResult
from tests.study_cli import in_process
from tests.study_helpers import study_attrs, trials_of, write_study

VIT_TARGET = Path(__file__).resolve().parent.parent / "studies" / "imagenet_vit_b16.yaml"


def _top1(folder: Path, seeds: list[int]) -> list[float]:
    return [read_summary(folder / f"seed_{s}").raw["final"]["val_top1"] for s in seeds]


def _row(table: str, name: str, metric: str = "top1") -> str:
    section = table.split(f"### {metric}", 1)[1].split("###", 1)[0]
    return next(line for line in section.splitlines() if line.startswith(f"| {name} |"))


@pytest.mark.slow
def test_confirm_reruns_the_best_and_both_references_with_fresh_seeds(tmp_path: Path, mlflow_db: Path,
                                                                      abtune_main: Callable[..., CliResult]) -> None:
    url, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{mlflow_db}"
    in_process(abtune_main, "study", "create", str(write_study(tmp_path / "s.yaml", trials=3)), "--storage", url,
               cwd=tmp_path)
    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path)
    promote = ("promote", "tiny", "--storage", url, "--to", str(VIT_TARGET), "--nodes", "2", "--scaling", "local",
               "--dry-run", "--no-tracking")
    before = in_process(abtune_main, *promote, cwd=tmp_path)
    assert "rests on a single run per configuration" in before.stderr and "abtune study confirm tiny" in before.stderr

    shown = in_process(abtune_main, "study", "confirm", "tiny", "--top", "1", "--seeds", "3", "--parallel", "2",
                       "--storage", url, "--tracking-uri", tracking, cwd=tmp_path).stdout
    table = (Path(study_attrs(url)["abtune.study_dir"]) / "confirm" / "confirmation.md").read_text()
    assert "recommended: trial" in shown or "not recommended:" in shown
    trials = trials_of(url)
    best = max((t for t in trials if t.user_attrs.get("reference") != DDP), key=lambda t: (t.values[0], -t.number))
    paper, ddp = results.reference(trials, PAPER_DEFAULTS), results.reference(trials, DDP)
    attrs = study_attrs(url)
    index = attrs["abtune.confirmation"]
    seeds = index["seeds"]
    assert seeds == [1000, 2000, 3000]  # fresh: the search ran seed 0
    assert index["candidates"] == [best.number] and set(index["trials"]) == {best.number, paper.number, ddp.number}
    confirm_dir = Path(attrs["abtune.study_dir"]) / "confirm"
    top1 = {n: _top1(confirm_dir / f"trial_{n}", seeds) for n in index["trials"]}
    for number, values in top1.items():
        record = attrs[f"abtune.confirmation.trial_{number}"]
        mean = sum(values) / 3
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
        assert record["metrics"]["top1"]["values"] == values
        assert record["metrics"]["top1"]["mean"] == pytest.approx(mean, abs=1e-15)
        assert record["metrics"]["top1"]["std"] == pytest.approx(std, abs=1e-15)
        assert f"| {mean:.4f} ± {std:.4f} |" in _row(table, record["name"])
        for seed in seeds:
            assert f"\nseed: {seed}\n" in (confirm_dir / f"trial_{number}" / f"seed_{seed}" / "config.yaml").read_text()

    # the paired test of the paper defaults against DDP, by hand
    d = [a - b for a, b in zip(top1[paper.number], top1[ddp.number], strict=True)]
    d_mean = sum(d) / 3
    d_std = math.sqrt(sum((x - d_mean) ** 2 for x in d) / 2)
    versus = attrs[f"abtune.confirmation.trial_{paper.number}"]["versus"]["ddp"]["top1"]
    assert versus["diff"] == pytest.approx(d_mean, abs=1e-15)
    if d_std > 0:
        t = d_mean / (d_std / math.sqrt(3))
        assert versus["t"] == pytest.approx(t, rel=1e-9)
        paper_name = attrs[f"abtune.confirmation.trial_{paper.number}"]["name"]
        assert f"{d_mean:+.4f}: {versus['verdict']} (t {t:.2f}, p {versus['p']:.3f})" in _row(table, paper_name)
    assert "paired t-test over shared seeds (scipy.stats.ttest_rel" in table
    traffic = {n: [read_summary(confirm_dir / f"trial_{n}" / f"seed_{s}").raw["traffic"]
                   ["training_inter_node_bytes"] for s in seeds] for n in (paper.number, ddp.number)}
    paper_bytes = attrs[f"abtune.confirmation.trial_{paper.number}"]["versus"]["ddp"]["inter_node_bytes"]
    assert paper_bytes["diff"] == pytest.approx(sum(traffic[paper.number]) / 3 - sum(traffic[ddp.number]) / 3)

    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    run = client.get_run(index["mlflow_run_id"])
    assert run.info.run_name == "confirmation"
    artifacts = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "report")}
    assert artifacts["report/confirmation.md"] > 0 and artifacts["report/confirmation.png"] > 0, artifacts
    assert run.data.metrics[f"trial_{paper.number}.top1_mean"] == pytest.approx(sum(top1[paper.number]) / 3)

    after = in_process(abtune_main, *promote, cwd=tmp_path)
    assert "rests on" not in after.stderr
    chosen = max((n for n in index["trials"] if n != ddp.number),
                 key=lambda n: (attrs[f"abtune.confirmation.trial_{n}"]["values"][0], -n))
    assert f"tiny #{chosen}; confirmed top-1" in after.stdout, after.stdout


def test_bad_confirmations_give_one_line_and_exit_2(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    assert abtune_main("study", "create", str(write_study(tmp_path / "s.yaml", trials=3)), "--storage", url,
                       cwd=tmp_path).returncode == 0
    for args, expected in ((("--seeds", "1"), "--seeds at least 2"),
                           ((), "study tiny has no finished reference trial (paper defaults, DDP)")):
        result = abtune_main("study", "confirm", "tiny", *args, "--storage", url, "--no-tracking")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    bad = write_study(tmp_path / "bad.yaml", repeats=0)
    result = abtune_main("study", "create", str(bad), "--storage", url)
    assert result.returncode == 2 and "repeats" in result.stderr and "Traceback" not in result.stderr, result.stderr
