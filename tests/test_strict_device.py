"""Strict-device mode: a tensor a GPU run would hold on the CPU fails a CPU run the way NCCL would.

The end-to-end test runs every method on 2 real gloo ranks with ABTUNE_STRICT_DEVICE=1, through the
collectives of set-up, training (AB's decomposition, rank agreement and sync included), evaluation,
pruning control, checkpoints and the summary. On the code before the fix of AB's rank agreement
(`torch.tensor([...])` without a device) the `ab` and `ab-nogroups` runs fail at the first
decomposition with the meter's error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from abtune.comm import CommMeter, Topology
from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.errors import TrainingFailed
from abtune.methods import METHOD_NAMES
from abtune.methods.ab import lowrank
from abtune.models import build_model
from abtune.runfiles import read_summary
from abtune.strict_device import STRICT_DEVICE_VARIABLE, is_foreign, strict_devices
from tests.conftest import CliResult, write_config

STEPS = 20  # AB: warmup 4 steps, then decompose, train A/B, sync every step; PowerSGD compresses from 10


def test_meter_refuses_a_tensor_on_another_device_naming_collective_group_and_devices() -> None:
    meter = CommMeter(Topology((0, 1)), torch.device("cpu"))
    with pytest.raises(TrainingFailed) as raised:
        meter.all_reduce(torch.zeros(3, device="meta"), meter.world())
    message = str(raised.value)
    assert "all_reduce over group 'world'" in message
    assert "is on meta" in message and "the run's device is cpu" in message


def test_strict_mode_marks_what_a_gpu_run_would_hold_on_the_cpu() -> None:
    run_device = torch.device("cpu")
    meter = CommMeter(Topology((0, 1)), run_device)
    with strict_devices(True):
        unplaced = torch.tensor([1, 2])
        placed = torch.tensor([1, 2], device=run_device)
        model = torch.nn.Linear(2, 2)
        assert is_foreign(unplaced) and is_foreign(unplaced.view(2, 1)) and is_foreign(unplaced * 2)
        assert not is_foreign(placed) and not is_foreign(placed + unplaced) and not is_foreign(placed.cpu() * 0 + placed)
        assert is_foreign(placed.cpu()) and not is_foreign(placed)  # .cpu() copies, as on a GPU run
        assert is_foreign(model.weight)
        model.to(run_device)
        assert not is_foreign(model.weight) and not is_foreign(unplaced.to(run_device))
        with pytest.raises(TrainingFailed, match="strict-device mode"):
            meter.broadcast(unplaced, 0, meter.world())
    assert not is_foreign(unplaced)  # outside the mode nothing is foreign


def test_factored_layers_keep_every_tensor_on_the_run_device() -> None:
    """Factoring, a training step through the thin products and merging make nothing a GPU run would hold on
    the CPU (the factors come from the weights' SVD on their device)."""
    run_device = torch.device("cpu")
    with strict_devices(True):
        model = build_model(ModelConfig(arch="vit", patch_size=4, num_layers=1, num_heads=2, hidden_dim=16,
                                        mlp_dim=32), DatasetInfo(10, 8, 3)).to(run_device)
        refs = lowrank.eligible_weights(model)
        for ref in refs:
            lowrank.factor(model, ref, 3)
        images = torch.randn(2, 3, 8, 8).to(run_device)
        logits = model(images)
        logits.sum().backward()
        assert not is_foreign(logits)
        assert not any(is_foreign(p) or (p.grad is not None and is_foreign(p.grad)) for p in model.parameters())
        for ref in refs:
            lowrank.merge(model, ref)
        assert not any(is_foreign(p) for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_method_trains_end_to_end_in_strict_device_mode(tmp_path: Path, method: str,
                                                             abtune_main_fd: Callable[..., CliResult]) -> None:
    """`abtune train` in this process (its ranks are processes, forked warm, that inherit the variable)."""
    factor_every_weight = {"rank_cap": None} if method.startswith("ab") else {}  # the factored layers run
    config = write_config(tmp_path / "run.yaml", method={"name": method, **factor_every_weight},
                          train={"steps": STEPS, "eval_every": STEPS // 2, "checkpoint_every": STEPS // 2})
    run_dir = tmp_path / "run"
    result = abtune_main_fd("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir),
                            "--no-tracking", env={STRICT_DEVICE_VARIABLE: "1"})
    assert result.returncode == 0, result.stderr
    summary = read_summary(run_dir).raw
    assert summary["strict_device"] is True
    assert summary["steps_done"] == STEPS
    phases = summary["traffic"]["by_phase"]
    assert {"setup", "eval", "checkpoint"} <= phases.keys()
    if method.startswith("ab"):
        assert summary["decompositions"] and "ab" in phases
        assert len(summary["decompositions"][0]["ranks"]) == 4  # attention input and output projection, MLP
    if method == "ab":  # without groups the ranks never diverge: a sync sends nothing
        assert "sync" in phases
