"""Resuming AB from a full-rank checkpoint taken after a sync.

Found by the SLURM requeue test: after a sync, `lowrank.merge` re-registers the rebuilt weights, so
the optimizer's parameter order differs from a freshly built model's. Restored by position, the
moments landed on parameters of other shapes ("The size of tensor a (16) must match the size of
tensor b (48)"); the checkpoint now keys optimizer state by parameter name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli, write_config

pytestmark = pytest.mark.slow


def test_ab_resumes_from_a_checkpoint_after_a_sync_to_the_same_parameters(tmp_path: Path) -> None:
    # 150 steps: warmup 30, then AB 5 + rebound 1 (rounded) cycles; step 120 is a rebound's end, after a sync
    # rank_cap null: the tiny model's ranks stay near full, and this test is about resuming factored weights
    config = write_config(tmp_path / "ab.yaml", method={"name": "ab", "rank_cap": None},
                          train={"steps": 150, "checkpoint_every": 120, "eval_every": 150})
    run_dir = tmp_path / "run"
    run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir), "--no-tracking")
    final = run_dir / "checkpoints" / "step_00000150"
    uninterrupted = [torch.load(final / f"rank_{r}.pt", weights_only=False) for r in range(2)]
    shutil.rmtree(final)
    (run_dir / "summary.json").unlink()
    result = run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir),
                     "--resume", "--no-tracking", check=False)
    assert result.returncode == 0, result.stderr
    for rank, before in enumerate(uninterrupted):
        after = torch.load(final / f"rank_{rank}.pt", weights_only=False)
        for key, value in before["model"].items():
            assert torch.equal(after["model"][key], value), key
        assert after["optimizer"]["state"].keys() == before["optimizer"]["state"].keys()
