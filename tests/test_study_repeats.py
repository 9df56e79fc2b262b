"""Seed repeats of a real study: means, spreads and seed folders against the runs' own summaries."""

from __future__ import annotations

import csv
import io
import json
import math
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import DDP, REFERENCE_ATTR
from abtune.runfiles import read_summary
from abtune.study import results
from abtune.study.runner import INTERRUPTED
from tests.conftest import CliResult, wait_for
from tests.study_cli import in_process
from tests.study_helpers import running, signal_group, start_run, trials_of, write_study

Abtune = Callable[..., CliResult]

pytestmark = pytest.mark.slow


def _seed_dirs(trial: FrozenTrial) -> list[Path]:
    return [Path(trial.user_attrs["run_dir"]) / f"seed_{s}" for s in trial.user_attrs["seeds"]]


def _evaluations(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["val_top1"] for r in rows if r["kind"] == "evaluation"}


def test_repeats_give_means_and_a_restart_keeps_finished_seeds(tmp_path: Path, mlflow_db: Path,
                                                                abtune_main: Abtune) -> None:
    """`repeats: 2`, 3 trials (both references and one searched): the searched trial trains seeds 0 and
    1000 one after another (a pruner is set, so the running mean is reported; the references, never
    pruned, train theirs side by side); Ctrl-C after its first seed finished, and the restarted study
    copies that seed instead of training it again."""
    url, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{mlflow_db}"
    study = write_study(tmp_path / "s.yaml", trials=3, repeats=2, pruner={"name": "median"})
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)

    def first_seed_finished() -> FrozenTrial | None:
        for trial in running(url):
            searched = trial.user_attrs.get(REFERENCE_ATTR) is None  # its seeds run one after another
            started = trial.user_attrs.get("seeds") and trial.user_attrs.get("run_dir")  # seeds are set first
            if searched and started and (_seed_dirs(trial)[0] / "summary.json").exists():
                return trial
        return None

    worker = start_run(tmp_path, "tiny", "--storage", url, "--tracking-uri", tracking)
    interrupted = wait_for(first_seed_finished, 300, "a trial whose first seed finished")
    signal_group(worker, signal.SIGINT)
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 130, err
    first_summary = (_seed_dirs(interrupted)[0] / "summary.json").read_text()
    assert trials_of(url)[interrupted.number].user_attrs["fail_reason"] == INTERRUPTED

    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--tracking-uri", tracking, cwd=tmp_path)
    trials = trials_of(url)
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == interrupted.number)
    assert retry.user_attrs["reused_seeds"] == [0]
    assert (_seed_dirs(retry)[0] / "summary.json").read_text() == first_summary  # copied, not trained again

    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == results.finished_count(trials) == 3, [(t.number, t.state) for t in trials]
    for trial in done:
        assert trial.user_attrs["seeds"] == [0, 1000]
        summaries = [read_summary(d).raw for d in _seed_dirs(trial)]
        for folder, seed in zip(_seed_dirs(trial), (0, 1000), strict=True):
            assert f"\nseed: {seed}\n" in (folder / "config.yaml").read_text()
        top1 = [s["final"]["val_top1"] for s in summaries]
        traffic = [float(s["traffic"]["training_inter_node_bytes"]) for s in summaries]
        assert trial.user_attrs["top1_seeds"] == top1
        assert trial.values == [pytest.approx((top1[0] + top1[1]) / 2, abs=1e-15)]
        assert trial.user_attrs["top1_std"] == pytest.approx(abs(top1[0] - top1[1]) / math.sqrt(2), abs=1e-15)
        assert trial.user_attrs["inter_node_bytes"] == pytest.approx(sum(traffic) / 2)
        if trial.user_attrs.get("reference") != DDP:  # the curve the pruner saw: the mean over the seeds
            curves = [_evaluations(d) for d in _seed_dirs(trial)]
            assert trial.intermediate_values == pytest.approx({s: (curves[0][s] + curves[1][s]) / 2 for s in curves[0]})
        _check_mlflow_run(tracking, trial, top1)

    exported = in_process(abtune_main, "study", "export", "tiny", "--storage", url, cwd=tmp_path).stdout
    rows = list(csv.DictReader(io.StringIO(exported)))
    for row in rows:
        trial = trials[int(row["number"])]
        if trial.state == TrialState.COMPLETE:
            assert float(row["top1_std"]) == pytest.approx(trial.user_attrs["top1_std"])
            assert json.loads(row["top1_seeds"]) == trial.user_attrs["top1_seeds"]
    best = results.best_trial(trials)
    shown = in_process(abtune_main, "study", "best", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert f"{best.user_attrs['top1']:.4f} ± {best.user_attrs['top1_std']:.4f}" in shown, shown
    status = in_process(abtune_main, "study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    held = "recommended so far" if "not recommended:" not in status else "closest to DDP"  # held against DDP
    assert (f"{held}: trial {best.number} (mean over 2 seeds: top-1 {best.user_attrs['top1']:.4f} ± "
            f"{best.user_attrs['top1_std']:.4f}, inter-node MB") in " ".join(status.split()), status


def _check_mlflow_run(tracking: str, trial: FrozenTrial, top1: list[float]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    metrics = client.get_run(trial.user_attrs["mlflow_run_id"]).data.metrics
    assert metrics["top1_seed_0"] == pytest.approx(top1[0]) and metrics["top1_seed_1000"] == pytest.approx(top1[1])
    assert metrics["top1_mean"] == pytest.approx(trial.user_attrs["top1"])
    assert metrics["top1_std"] == pytest.approx(trial.user_attrs["top1_std"])
