"""A known bug, pinned: resuming AB from a full-rank checkpoint taken after a sync crashes.

Found by the SLURM requeue test. After a sync, `lowrank.merge` re-registers the rebuilt weights, so
the optimizer's parameter order differs from a freshly built model's; `Optimizer.load_state_dict`
maps moments by position, so on resume they land on parameters of other shapes and the first step
fails ("The size of tensor a (16) must match the size of tensor b (48)"). Checkpoints inside an AB
phase resume fine (tests/test_training_distributed.py). Fix: save and restore optimizer state by
parameter name. Remove the xfail then.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_config

pytestmark = pytest.mark.slow


@pytest.mark.xfail(strict=True, reason="optimizer state is restored by position, not by parameter name")
def test_ab_resumes_from_a_checkpoint_after_a_sync(tmp_path: Path) -> None:
    # 150 steps: warmup 30, then AB 5 + rebound 1 (rounded) cycles; step 120 is a rebound's end, after a sync
    config = write_config(tmp_path / "ab.yaml", method={"name": "ab"},
                          train={"steps": 150, "checkpoint_every": 120, "eval_every": 150})
    run_dir = tmp_path / "run"
    run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir))
    shutil.rmtree(run_dir / "checkpoints" / "step_00000150")
    (run_dir / "summary.json").unlink()
    result = run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir),
                     "--resume", check=False)
    assert result.returncode == 0, result.stderr
