"""The comparison methods: SBC's error feedback in process (a real one-rank gloo group), and
SBC, PowerSGD and fp16 on 4 real ranks with their traffic checked against formulas."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from abtune.config import load_run_config
from abtune.data import DatasetInfo
from abtune.dist import discover_topology
from abtune.methods.base import MethodContext
from abtune.methods.sbc.compress import dense_from, sparse_binarize
from abtune.methods.sbc.method import SparseBinaryCompression
from abtune.methods.sbc.settings import SbcConfig
from abtune.models import build_model
from tests.conftest import CliResult, write_config
from tests.train_here import train_here

NPROC, RANKS_PER_NODE = 4, 2
FLOAT32, FLOAT16, INT32, INT64 = 4, 2, 4, 8
ALL_REDUCE_WIRE = 2 * (NPROC - 1) / NPROC
ALL_GATHER_WIRE = (NPROC - 1) / NPROC
DIGITS = DatasetInfo(num_classes=10, image_size=8, in_channels=3)


# --- SBC's error feedback, in process ---------------------------------------------------------------


def _sbc(env: Any, model: nn.Module, **config: Any) -> SparseBinaryCompression:
    _, meter = discover_topology(env)
    ctx = MethodContext(env, meter, total_steps=100, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                        make_dense_model=lambda: nn.Linear(50, 40))
    method = SparseBinaryCompression(SbcConfig(**config), ctx)
    method.setup(model, broadcast_initial=True)
    return method


def test_sbc_residual_keeps_exactly_what_was_not_sent(one_rank_world: Any) -> None:
    torch.manual_seed(0)
    model = nn.Linear(50, 40)
    method = _sbc(one_rank_world, model, sparsity=0.05, delay=1)
    start = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param))
    updates = [p.detach() - s for p, s in zip(model.parameters(), start, strict=True)]

    method.exchange()

    for param, reference, residual, update, before in zip(
        model.parameters(), method.reference, method.residual, updates, start, strict=True
    ):
        sent = dense_from(sparse_binarize(update, 0.05)).view_as(update)
        assert torch.equal(residual, update - sent)  # what was dropped, bit for bit
        assert torch.equal(reference, before + sent)  # one rank: the mean is its own message
        assert torch.equal(param.detach(), reference)
        kept = sent != 0
        assert kept.sum() == max(1, -(-update.numel() * 5 // 100))  # ceil(5%) of one side
        assert torch.equal(residual[~kept], update[~kept])

    # the next exchange sends from update + residual: with no new training, the residual itself
    carried = [r.clone() for r in method.residual]
    method.exchange()
    for residual, previous in zip(method.residual, carried, strict=True):
        assert torch.equal(residual, previous - dense_from(sparse_binarize(previous, 0.05)).view_as(previous))
    assert method.stats.exchanges == 2


# --- four real ranks --------------------------------------------------------------------------------


Abtune = Callable[..., CliResult]


def _train(abtune_main: Abtune, tmp_path: Path, name: str, steps: int = 40,
           **sections: Any) -> tuple[Path, dict[str, Any]]:
    config = write_config(tmp_path / f"{name}.yaml", train={"steps": steps, "eval_every": 1000}, **sections)
    run_dir = tmp_path / name
    return run_dir, train_here(abtune_main, config, run_dir, NPROC, RANKS_PER_NODE)


def _final_models(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    final = sorted((run_dir / "checkpoints").iterdir())[-1]
    return [torch.load(final / f"rank_{r}.pt", weights_only=False)["model"] for r in range(NPROC)]


def _wire(summary: dict[str, Any], phase: str, op: str, rank: int = 0) -> float:
    rows = summary["traffic"]["rows_per_rank"][rank]
    return sum(r["wire_bytes"] for r in rows if r["phase"] == phase and r["op"] == op)


def _ddp_rebuild_wire(num_tensors: int) -> float:
    """DDP's one-time bucket-order broadcast (one bucket), on the wire."""
    return ((num_tensors + 1) * INT32 + INT32) * ALL_GATHER_WIRE


@pytest.mark.slow
def test_sbc_without_compression_delay_1_and_sgd_matches_ddp(tmp_path: Path, abtune_main: Abtune) -> None:
    sgd = {"name": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0}
    ddp_dir, _ = _train(abtune_main, tmp_path, "ddp", steps=12, optimizer=sgd)
    sbc_dir, sbc = _train(abtune_main, tmp_path, "sbc", steps=12, optimizer=sgd,
                          method={"name": "sbc", "sparsity": 1.0, "binarize": False, "delay": 1})
    ddp_models, sbc_models = _final_models(ddp_dir), _final_models(sbc_dir)
    for key, ddp_value in ddp_models[0].items():
        torch.testing.assert_close(sbc_models[0][key], ddp_value, rtol=0, atol=1e-6)
        for other in sbc_models[1:]:
            assert torch.equal(other[key], sbc_models[0][key]), key  # every rank decodes the same frames
    assert sbc["sbc"]["exchanges"] == 12


@pytest.mark.slow
def test_sbc_traffic_is_the_encoded_bytes(tmp_path: Path, abtune_main: Abtune) -> None:
    run_dir, summary = _train(abtune_main, tmp_path, "sbc", method={"name": "sbc", "delay": 10, "sparsity": 0.05})
    stats = summary["sbc"]
    assert stats["exchanges"] == 4
    # per exchange: all-gather of the lengths (int64 per rank), then of the frames padded to the longest
    expected = stats["exchanges"] * NPROC * INT64 * ALL_GATHER_WIRE + stats["padded_frame_bytes"] * NPROC * ALL_GATHER_WIRE
    assert _wire(summary, "train", "all_gather") == pytest.approx(expected)
    assert _wire(summary, "train", "all_reduce") == 0
    assert stats["encoded_bytes"] <= stats["padded_frame_bytes"] <= 1.2 * stats["encoded_bytes"]
    assert stats["encoded_vs_closed_form"] == pytest.approx(1.0, abs=0.05)
    first, *others = _final_models(run_dir)
    for other in others:
        for key, value in first.items():
            assert torch.equal(other[key], value), key


def _tiny_model(tmp_path: Path) -> nn.Module:
    return build_model(load_run_config(write_config(tmp_path / "shape.yaml")).model, DIGITS)


@pytest.mark.slow
def test_fp16_sends_half_of_ddp(tmp_path: Path, abtune_main: Abtune) -> None:
    _, summary = _train(abtune_main, tmp_path, "fp16", method={"name": "fp16"})
    params = list(_tiny_model(tmp_path).parameters())
    numel = sum(p.numel() for p in params)
    assert _wire(summary, "train", "all_reduce") == 40 * numel * FLOAT16 * ALL_REDUCE_WIRE
    assert _wire(summary, "train", "broadcast") == pytest.approx(_ddp_rebuild_wire(len(params)))
    assert summary["compression"]["method_ratio"] == 2.0


@pytest.mark.slow
def test_powersgd_traffic_matches_its_low_rank_formula(tmp_path: Path, abtune_main: Abtune) -> None:
    rank, start = 2, 10
    _, summary = _train(abtune_main, tmp_path, "powersgd", method={"name": "powersgd", "rank": rank, "start_step": start,
                                                     "min_compression_rate": 1.0})
    params = list(_tiny_model(tmp_path).parameters())
    dense = sum(p.numel() for p in params)
    compressed = 0
    for param in params:
        rows, cols = param.reshape(param.shape[0], -1).shape
        r = min(rows, cols, rank)
        compressed += (rows + cols) * r if (rows + cols) * r * 1.0 < rows * cols else rows * cols
    expected_elements = start * dense + (40 - start) * compressed
    assert _wire(summary, "train", "all_reduce") == expected_elements * FLOAT32 * ALL_REDUCE_WIRE
    assert compressed < dense
    assert summary["compression"]["method_ratio"] == pytest.approx(dense / compressed)
