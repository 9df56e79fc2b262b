"""A tracking store that fails once work has started costs records, never the work: rank 0 trains on, the
study runner goes on with one warning, no traceback, and no trial is left RUNNING."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.trial import TrialState

from abtune.training.hooks import TrainingHook
from tests.conftest import CliResult
from tests.study_cli import in_process
from tests.study_helpers import TINY_BASE, trials_of, write_study

Abtune = Callable[..., CliResult]

# One rank, ten steps: the fault is in the tracking, not the training.
SHORT_BASE = {**TINY_BASE, "train": {"steps": 10, "local_batch_size": 16, "eval_every": 5, "log_every": 5},
              "method": {"name": "ddp"}}
SHORT_SPACE = {"optimizer.lr": {"low": 1e-3, "high": 3e-3}}


def break_store(run_dir: Path, store: str, once: str) -> TrainingHook:
    """A trial hook that deletes the MLflow store (its SQLite file and artifacts) as the first trial starts and
    leaves a file in its place that no SQLite opens."""
    if not Path(once).exists():
        Path(once).touch()
        shutil.rmtree(Path(store).parent / "mlartifacts", ignore_errors=True)
        Path(store).unlink()
        Path(store).write_text("not a database any more\n")
    return TrainingHook()


def test_rank_0_trains_on_when_the_store_fails_as_its_hook_opens_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from abtune.tracking.hook import make_hook

    store = tmp_path / "mlflow.db"
    store.write_text("not a database\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    hook = make_hook(tmp_path, "0123456789abcdef")
    hook.on_log({"step": 5, "loss": 1.0, "lr": 0.1, "phase": "warmup", "step_seconds": 0.1, "total_bytes": 1,
                 "inter_node_bytes": 0, "intra_node_bytes": 1})
    hook.close()
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("abtune: warning: MLflow is unreachable"), warnings


@pytest.mark.slow
def test_a_study_goes_on_when_its_store_is_deleted_mid_study(tmp_path: Path, mlflow_db: Path,
                                                              abtune_main: Abtune) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    hook = {"factory": f"{__name__}:break_store", "options": {"store": str(mlflow_db), "once": str(tmp_path / "broken")}}
    study = write_study(tmp_path / "s.yaml", trials=2, references={"paper_defaults": False, "ddp": True},
                        hooks=[hook], base=SHORT_BASE, space=SHORT_SPACE, layout={"nproc": 1})
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)
    result = in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--tracking-uri", f"sqlite:///{mlflow_db}",
                        cwd=tmp_path, check=False)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and warnings[0].startswith("abtune: warning: MLflow"), result.stderr
    trials = trials_of(url)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    assert all((Path(t.user_attrs["run_dir"]) / "metrics.jsonl").stat().st_size > 0 for t in trials)
