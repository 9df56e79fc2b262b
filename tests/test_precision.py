"""Mixed precision on the CPU (autocast runs bf16 and fp16 there): bf16 trains like fp32, fp16's
scaler survives an overflow, a bf16 run resumes bit for bit, and what crosses the wire stays fp32."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from abtune.training.precision import Precision
from tests.conftest import CliResult, train_and_read, write_config
from tests.train_here import train_here

NPROC = 2
# The quickstart model (run_quickstart.yaml) on digits, shortened. bf16 keeps 8 bits of mantissa:
# the forward pass of each step differs from fp32's by ~0.4% relative, the trajectories drift
# apart, and with 360 validation digits one sample is 0.28 points of top-1.
QUICKSTART_MODEL = {"arch": "vit", "patch_size": 4, "num_layers": 2, "num_heads": 4, "hidden_dim": 64, "mlp_dim": 128}
COMPARISON_STEPS = 100  # AB's warm-up and factored phases; fp32 reached 0.93-0.94 top-1 over seeds 0-2
TOP1_TOLERANCE = 0.03  # absolute, on the final validation top-1 (about 11 of 360 digits)
LOSS_TOLERANCE = 0.15  # relative, on the final validation loss


Abtune = Callable[..., CliResult]


def _train(abtune_main: Abtune | None, tmp_path: Path, name: str, *extra: str,
           **sections: Any) -> tuple[Path, dict[str, Any]]:
    """In this process, or with None through the installed command."""
    config = write_config(tmp_path / f"{name}.yaml", **sections)
    run_dir = tmp_path / name
    if abtune_main is None:
        return run_dir, train_and_read(config, run_dir, NPROC, 1, *extra)
    return run_dir, train_here(abtune_main, config, run_dir, NPROC, 1, *extra)


def _checkpoint(run_dir: Path, step: int, rank: int = 0) -> dict[str, Any]:
    return torch.load(run_dir / "checkpoints" / f"step_{step:08d}" / f"rank_{rank}.pt", weights_only=False)


def test_fp16_scaler_skips_an_overflow_step_and_lowers_its_scale() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp16", torch.device("cpu"), loss_scale=2.0**60)
    before = model.weight.detach().clone()
    with precision.autocast():
        loss = model(torch.randn(16, 8)).square().mean()
    precision.backward(loss)
    assert not precision.step(optimizer)  # scaled gradients overflowed fp16: skipped
    assert torch.equal(model.weight, before)
    assert precision.loss_scale() == 2.0**59
    restored = Precision("fp16", torch.device("cpu"), loss_scale=1.0)
    restored.load_state_dict(precision.state_dict())
    assert restored.loss_scale() == 2.0**59


@pytest.mark.slow
def test_bf16_trains_within_tolerance_of_fp32(tmp_path: Path, abtune_main: Abtune) -> None:
    """AB: its warmup is DDP's training (the same bytes asserted below), then its factored phases."""
    sections = {"model": QUICKSTART_MODEL, "data": {"name": "digits", "augment": False}, "method": {"name": "ab"}}
    results = {}
    for precision in ("fp32", "bf16"):
        _, results[precision] = _train(abtune_main, tmp_path, precision, train={
            "steps": COMPARISON_STEPS, "local_batch_size": 32, "eval_every": 1000, "precision": precision}, **sections)
    fp32, bf16 = results["fp32"]["final"], results["bf16"]["final"]
    print(f"ab: top-1 fp32 {fp32['val_top1']:.4f} bf16 {bf16['val_top1']:.4f}; "
          f"loss fp32 {fp32['val_loss']:.4f} bf16 {bf16['val_loss']:.4f}")
    assert results["bf16"]["precision"]["name"] == "bf16"
    assert fp32["val_top1"] > 0.8  # both really trained
    assert abs(bf16["val_top1"] - fp32["val_top1"]) <= TOP1_TOLERANCE
    assert bf16["val_loss"] == pytest.approx(fp32["val_loss"], rel=LOSS_TOLERANCE)
    assert bf16["val_loss"] != fp32["val_loss"]  # autocast really ran
    # full-rank gradients stay fp32 under autocast: the same bytes cross the wire (after AB's first
    # decomposition the ranks follow the weights' spectra, which bf16 moves a little)
    assert [results[p]["traffic"]["by_phase"]["warmup"]["total"] for p in results] == [
        results["fp32"]["traffic"]["by_phase"]["warmup"]["total"]] * 2


@pytest.mark.slow
def test_fp16_run_recovers_from_overflow_steps(tmp_path: Path, abtune_main: Abtune) -> None:
    # 2**24 overflows fp16's gradients (max 65504) until the scaler has halved it enough
    run_dir, summary = _train(
        abtune_main, tmp_path, "fp16", model=QUICKSTART_MODEL, data={"name": "digits", "augment": False},
        schedule={"name": "constant", "warmup_frac": 0.0},
        train={"steps": 60, "eval_every": 1000, "precision": "fp16", "loss_scale": 2.0**24})
    skipped = summary["precision"]["skipped_steps"]
    print(f"fp16: {skipped} of 60 steps skipped, final loss scale {summary['precision']['loss_scale']}, "
          f"top-1 {summary['final']['val_top1']:.4f}")
    assert 1 <= skipped <= 20
    assert summary["steps_done"] == 60 and summary["stopped_early"] is None  # skipped steps are not failures
    assert summary["precision"]["loss_scale"] == 2.0**24 / 2**skipped  # halved per skip, no growth in 60 steps
    assert math.isfinite(summary["final"]["val_loss"]) and summary["final"]["val_top1"] > 0.5
    log = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r.get("kind") == "log"]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < 0.8 * losses[0]
    assert [r["skipped_steps"] for r in log if r.get("kind") == "log"][-1] == skipped
    ranks = [_checkpoint(run_dir, 60, rank) for rank in range(NPROC)]
    assert {r["train_state"]["skipped_steps"] for r in ranks} == {skipped}  # ranks skip together (DDP)
    assert ranks[0]["scaler"]["scale"] == summary["precision"]["loss_scale"]


@pytest.mark.slow
def test_bf16_resume_is_bit_identical(tmp_path: Path) -> None:
    """Through the installed command: a run's lock names the command that trained it, and --resume refuses a
    folder whose command is still alive (this process, had it trained here)."""
    sections = {"method": {"name": "ab"},
                "train": {"steps": 40, "checkpoint_every": 20, "eval_every": 1000, "precision": "bf16"}}
    run_dir, _ = _train(None, tmp_path, "bf16", **sections)
    final = run_dir / "checkpoints" / "step_00000040"
    uninterrupted = [_checkpoint(run_dir, 40, rank) for rank in range(NPROC)]
    shutil.rmtree(final)
    (run_dir / "summary.json").unlink()
    _train(None, tmp_path, "bf16", "--resume", **sections)
    for rank, before in enumerate(uninterrupted):
        after = _checkpoint(run_dir, 40, rank)
        for key, value in before["model"].items():
            assert torch.equal(after["model"][key], value), key
        for name, state in before["optimizer"]["state"].items():
            for slot, value in state.items():
                assert torch.equal(after["optimizer"]["state"][name][slot], value), (name, slot)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sbc", "powersgd"])
def test_bf16_keeps_residuals_and_error_feedback_in_fp32(tmp_path: Path, abtune_main: Abtune, method: str) -> None:
    results = {}
    for precision in ("fp32", "bf16") if method == "powersgd" else ("bf16",):  # sbc: the checkpoint tells
        run_dir, results[precision] = _train(abtune_main, tmp_path, precision, method={"name": method}, train={
            "steps": 20, "eval_every": 1000, "precision": precision})
    if method == "sbc":
        saved = _checkpoint(run_dir, 20)["method"]
        assert {t.dtype for t in saved["residual"] + saved["reference"]} == {torch.float32}
    else:  # P, Q, the error feedback and the uncompressed rest take the gradients' dtype: fp32
        assert [results[p]["traffic"]["by_phase"]["train"]["total"] for p in results] == [
            results["fp32"]["traffic"]["by_phase"]["train"]["total"]] * 2
        assert results["bf16"]["compression"]["method_ratio"] == results["fp32"]["compression"]["method_ratio"]
