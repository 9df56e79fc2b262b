"""Factored layers that compute in low rank (abtune/methods/ab/layers.py), as lowrank swaps them in and out.

Full rank computes what the dense model does; the thin products cost r(m+n) multiply-adds a row, counted
alike by the layers and by torch's flop counter; ViT-B/16 at a quarter rank costs at most 0.70 of its dense
FLOPs; the frozen factor holds no gradient and no optimizer state; a checkpoint written when the factors
were torch parametrizations resumes.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from abtune.config import ModelConfig, load_run_config
from abtune.data import DatasetInfo
from abtune.dist import DistEnv, discover_topology
from abtune.methods.ab import layers, lowrank
from abtune.methods.ab.method import ABTraining
from abtune.methods.ab.settings import AbConfig
from abtune.methods.base import MethodContext
from abtune.models import build_model
from abtune.training.checkpoint import load_optimizer_state_by_name
from tests.conftest import train_and_read

DIGITS = DatasetInfo(num_classes=10, image_size=8, in_channels=3, name="digits")
TINY_VIT = ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
SMALL_CNN = ModelConfig(arch="small_cnn")
BATCH = 4
OLD_CHECKPOINT = Path(__file__).parent / "fixtures" / "ab_checkpoint_before_layers"


def _model(cfg: ModelConfig, info: DatasetInfo = DIGITS) -> nn.Module:
    torch.manual_seed(0)
    model = build_model(cfg, info)
    with torch.no_grad():  # torchvision's ViT starts with a zero head: make the logits depend on every layer
        for module in model.modules():
            if isinstance(module, nn.Linear) and not module.weight.any():
                nn.init.normal_(module.weight, std=0.1)
    return model.train()


def _images(info: DatasetInfo = DIGITS, batch: int = BATCH) -> torch.Tensor:
    return torch.randn(batch, info.in_channels, info.image_size, info.image_size, generator=torch.Generator().manual_seed(1))


def _full_rank(model: nn.Module, ref: lowrank.WeightRef) -> int:
    return min(lowrank.as_matrix(getattr(ref.module(model), ref.attr)).shape)


@pytest.mark.parametrize("cfg", [TINY_VIT, SMALL_CNN], ids=lambda cfg: cfg.arch)
@pytest.mark.parametrize("thin", [None, True], ids=["cheaper-product", "thin-products"])
def test_a_model_factored_at_full_rank_computes_what_the_dense_one_does(cfg: ModelConfig, thin: bool | None) -> None:
    model, images = _model(cfg), _images()
    dense = copy.deepcopy(model)
    refs = lowrank.eligible_weights(model)
    for ref in refs:
        lowrank.factor(model, ref, _full_rank(model, ref), thin=thin)
    assert all(isinstance(ref.module(model), layers.FactoredLayer) for ref in refs)
    expected, got = dense(images), model(images)
    assert expected.abs().max() > 0.1  # the logits depend on the weights
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    F.cross_entropy(got, torch.arange(BATCH)).backward()  # trains through the factors
    assert all(p.grad is not None for ref in refs for p in lowrank.factors(model, ref))


def test_thin_products_compute_the_product_of_the_factors_at_low_rank() -> None:
    model, images = _model(TINY_VIT), _images()
    thin = copy.deepcopy(model)
    for ref in lowrank.eligible_weights(model):
        lowrank.factor(model, ref, 3, thin=False)  # forms A @ B and runs the dense product
        lowrank.factor(thin, ref, 3)
        assert not ref.module(model)._factored[ref.attr].thin and ref.module(thin)._factored[ref.attr].thin
    torch.testing.assert_close(thin(images), model(images), rtol=1e-4, atol=1e-5)


def test_a_conv_with_stride_dilation_and_reflect_padding_computes_as_two_convolutions() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 8, 3, stride=2, padding=2, dilation=2, padding_mode="reflect")
    x = torch.randn(2, 6, 9, 9)
    expected = conv(x)
    a, b = lowrank.factorize(conv.weight, 8)  # 8 x 54 at full rank
    factored = layers.FactoredConv2d(copy.deepcopy(conv), a, b, thin=True)
    torch.testing.assert_close(factored(x), expected, rtol=1e-4, atol=1e-5)


def test_an_attention_with_only_its_output_projection_factored_computes_and_merges_back() -> None:
    model, images = _model(TINY_VIT), _images()
    expected_keys = list(model.state_dict())
    expected = model(images)
    attention = "encoder.layers.encoder_layer_0.self_attention"
    ref = lowrank.WeightRef(f"{attention}.out_proj", "weight")
    lowrank.factor(model, ref, 16)
    assert isinstance(model.get_submodule(attention), layers.FactoredAttention)
    assert isinstance(model.get_submodule(attention).in_proj_weight, nn.Parameter)  # kept dense, under its name
    torch.testing.assert_close(model(images), expected, rtol=1e-4, atol=1e-5)
    lowrank.merge(model, ref)
    assert type(model.get_submodule(attention)) is nn.MultiheadAttention
    assert sorted(model.state_dict()) == sorted(expected_keys)
    torch.testing.assert_close(model(images), expected, rtol=1e-4, atol=1e-5)


def test_merged_modules_are_the_dense_ones_and_load_a_dense_state_dict() -> None:
    model = _model(TINY_VIT)
    kinds = {name: type(module) for name, module in model.named_modules()}
    refs = lowrank.eligible_weights(model)
    bias = model.get_submodule("encoder.layers.encoder_layer_0.mlp.0").bias
    for ref in refs:
        lowrank.factor(model, ref, 4)
    assert model.get_submodule("encoder.layers.encoder_layer_0.mlp.0").bias is bias  # optimizer state survives
    for ref in refs:
        lowrank.merge(model, ref)
    assert {name: type(module) for name, module in model.named_modules()} == kinds
    assert model.get_submodule("encoder.layers.encoder_layer_0.mlp.0").bias is bias
    model.load_state_dict(_model(TINY_VIT).state_dict())  # strict: torchvision's keys, as a dense model has


@pytest.mark.parametrize("cfg", [TINY_VIT, SMALL_CNN], ids=lambda cfg: cfg.arch)
def test_the_layers_count_the_flops_torchs_flop_counter_counts(cfg: ModelConfig) -> None:
    model, images = _model(cfg), _images()
    dense_flops = _forward_flops(model, images)
    refs = lowrank.eligible_weights(model)
    for i, ref in enumerate(refs):  # every other weight at a rank too high to be cheaper thin
        lowrank.factor(model, ref, 2 if i % 2 else _full_rank(model, ref))
    counted: list[dict[str, int]] = []
    lowrank.count_product_flops(model, counted.append)
    factored_flops = _forward_flops(model, images)
    assert (dense_flops - factored_flops) == (counted[0]["dense"] - counted[0]["factored"]) * BATCH
    model(images)
    assert len(counted) == 1, "counted once, in the first forward"


def _forward_flops(model: nn.Module, images: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        model(images)
    return int(counter.get_total_flops())


def test_vit_b_16_factored_at_a_quarter_rank_costs_at_most_0_7_of_its_dense_forward_flops() -> None:
    """Training mode, batch 2, every eligible weight (attention input and output projections, MLPs) at a
    quarter of its full rank; built and counted on the meta device (shapes only)."""
    info = DatasetInfo(num_classes=1000, image_size=224, in_channels=3, name="imagenet")
    with torch.device("meta"):  # built, copied and factored as shapes: no 86M weights to initialize
        model = build_model(ModelConfig(arch="vit_b_16"), info).train()
        images = torch.zeros(2, 3, 224, 224)
        dense = _forward_flops(copy.deepcopy(model), images)
        refs = lowrank.eligible_weights(model)
        for ref in refs:  # the factors' values do not change the FLOPs: no SVD of 48 large weights
            m, n = lowrank.as_matrix(getattr(ref.module(model), ref.attr)).shape
            full = min(m, n)
            lowrank.factor(model, ref, full // 4, (torch.eye(m, full), torch.ones(full), torch.eye(full, n)))
    assert len(refs) == 48 and sum(isinstance(m, layers.FactoredAttention) for m in model.modules()) == 12
    assert all(p.is_meta for p in model.parameters())
    assert _forward_flops(model, images) <= 0.70 * dense


# --- AB's factored phase: what a rank holds -------------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def _set_spectrum(linear: nn.Linear, values: list[float]) -> None:
    with torch.no_grad():
        linear.weight.zero_()
        for i, value in enumerate(values):
            linear.weight[i, i] = value


def _step(method: ABTraining, step: int) -> None:
    method.begin_step(step)
    F.cross_entropy(method.module(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
    method.optimizer.step()
    method.optimizer.zero_grad(set_to_none=True)
    method.end_step(step)


def test_the_frozen_factor_holds_no_gradient_and_no_optimizer_state(one_rank_world: DistEnv) -> None:
    torch.manual_seed(0)
    model = _mlp()
    _set_spectrum(model[0], [1.0, 0.5])  # 8 x 6 at rank 2
    _set_spectrum(model[2], [1.0, 0.5, 0.4])  # 8 x 8 at rank 3
    _, meter = discover_topology(one_rank_world)
    ctx = MethodContext(one_rank_world, meter, 10, make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                        make_dense_model=_mlp)
    method = ABTraining(AbConfig(name="ab-nogroups", warmup_frac=0.2, ab_frac=0.3, rebound_frac=0.5,
                                 sigma_cutoff=0.3), ctx)
    method.setup(model, broadcast_initial=True)
    _step(method, 0)
    _step(method, 1)
    method.begin_step(2)
    refs = method.factored
    assert method.ranks == {"0.weight": 2, "2.weight": 3}
    frozen = [lowrank.factors(model, ref)[0] for ref in refs]  # without groups A is frozen, B trains
    F.cross_entropy(method.module(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
    assert all(a.grad is None and not a.requires_grad for a in frozen)
    method.optimizer.step()
    assert all(a not in method.optimizer.state for a in frozen)
    method.optimizer.zero_grad(set_to_none=True)

    dense = [6 * 8, 8, 8 * 8, 8, 8 * 3, 3]
    factored = [8, 8 * 2, 2 * 6, 8, 8 * 3, 3 * 8, 8 * 3, 3]  # biases, A (frozen) and B of both, head
    trained = [8, 2 * 6, 8, 3 * 8, 8 * 3, 3]
    assert method.held_bytes_by_phase == {
        "warmup": _held(sum(dense), sum(dense), len(dense)), "ab": _held(sum(factored), sum(trained), len(trained))}


def _held(parameters: int, trained: int, trained_tensors: int) -> dict[str, int]:
    """fp32 bytes; AdamW keeps two moments and a one-element fp32 step count per trained tensor."""
    float32 = 4
    held = {"parameters": float32 * parameters, "gradients": float32 * trained,
            "optimizer_state": float32 * (2 * trained + trained_tensors)}
    return {**held, "total": sum(held.values())}


# --- checkpoints written when A and B were torch parametrizations -----------------------------------------------


def _old_checkpoint() -> dict[str, Any]:
    return torch.load(OLD_CHECKPOINT / "rank_0.pt", weights_only=False)


def test_a_checkpoint_with_parametrized_factors_loads_its_factors_and_moments(one_rank_world: DistEnv) -> None:
    config = load_run_config(OLD_CHECKPOINT / "config.yaml")
    _, meter = discover_topology(one_rank_world)
    ctx = MethodContext(one_rank_world, meter, config.train.steps, lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                        lambda: build_model(config.model, DIGITS))
    method = ABTraining(config.method, ctx)
    method.setup(build_model(config.model, DIGITS), broadcast_initial=False)
    old = _old_checkpoint()
    saved = method.upgrade_checkpoint(_old_checkpoint())
    method.load_state_dict(saved["method"])
    method.model.load_state_dict(saved["model"])  # strict: every key has its parameter
    load_optimizer_state_by_name(method.model, method.optimizer, saved["optimizer"])
    attention = "encoder.layers.encoder_layer_0.self_attention"
    a, b = lowrank.factors(method.model, lowrank.WeightRef(attention, "in_proj_weight"))
    assert torch.equal(a, old["model"][f"{attention}.parametrizations.in_proj_weight.original0"])
    assert torch.equal(b, old["model"][f"{attention}.parametrizations.in_proj_weight.original1"])
    moments = method.optimizer.state[b]["exp_avg"]
    assert torch.equal(moments, old["optimizer"]["state"][f"{attention}.parametrizations.in_proj_weight.original1"]["exp_avg"])


@pytest.mark.slow
def test_a_run_resumes_from_a_checkpoint_with_parametrized_factors(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints" / "step_00000015"
    folder.mkdir(parents=True)
    shutil.copy(OLD_CHECKPOINT / "rank_0.pt", folder)
    (folder / "COMPLETE").touch()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(yaml.safe_load((OLD_CHECKPOINT / "config.yaml").read_text())))
    shutil.copy(config, run_dir / "config.yaml")
    summary = train_and_read(config, run_dir, 1, 1, "--resume")
    assert summary["steps_done"] == 40
    # the uninterrupted run of the code that wrote the checkpoint (fixtures/.../README.md); the factored
    # layers compute the same products in another order
    assert summary["final"]["val_loss"] == pytest.approx(2.298858727349175, abs=1e-5)
