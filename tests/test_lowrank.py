from __future__ import annotations

import torch
from torch import nn

from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.methods.ab import lowrank
from abtune.models import build_model

TINY = ModelConfig(arch="vit", patch_size=2, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32)
INFO = DatasetInfo(num_classes=10, image_size=8, in_channels=3)


def test_vit_keeps_patch_embedding_and_head_full_rank() -> None:
    model = build_model(TINY, INFO)
    keys = {ref.key for ref in lowrank.eligible_weights(model)}
    layer = "encoder.layers.encoder_layer_0"
    assert keys == {
        f"{layer}.self_attention.in_proj_weight", f"{layer}.self_attention.out_proj.weight",
        f"{layer}.mlp.0.weight", f"{layer}.mlp.3.weight",
    }


def test_keep_full_rank_globs_exclude_modules() -> None:
    model = build_model(TINY, INFO)
    keys = {ref.key for ref in lowrank.eligible_weights(model, ("*.mlp.*",))}
    assert not any(".mlp." in key for key in keys)


def test_conv_weights_are_factored_as_matrices() -> None:
    model = build_model(ModelConfig(arch="small_cnn"), INFO)
    refs = lowrank.eligible_weights(model)
    convs = [r for r in refs if isinstance(r.module(model), nn.Conv2d)]
    assert convs, "the small CNN has convolutions after the first"
    first_conv = next(name for name, m in model.named_modules() if isinstance(m, nn.Conv2d))
    assert all(r.module_name != first_conv for r in refs)


def test_rank_counts_singular_values_above_cutoff() -> None:
    sigma = torch.tensor([10.0, 5.0, 1.0, 0.99, 0.1])
    assert lowrank.rank_for_cutoff(sigma, 0.1) == 2  # strictly greater: 1.0 is not > 0.1 * 10
    assert lowrank.rank_for_cutoff(sigma, 0.05) == 4
    assert lowrank.rank_for_cutoff(sigma, 0.99) == 1  # never below one


def test_full_rank_factors_reproduce_the_weight() -> None:
    weight = torch.randn(12, 7, 3, 3)
    a, b = lowrank.factorize(weight, rank=12)  # viewed as 12 x 63: rank 12
    assert a.shape == (12, 12) and b.shape == (12, 63)
    torch.testing.assert_close((a @ b).view(weight.shape), weight, atol=1e-5, rtol=1e-5)


def test_truncated_factors_are_the_best_approximation() -> None:
    torch.manual_seed(0)
    weight = torch.randn(20, 30)
    a, b = lowrank.factorize(weight, rank=5)
    sigma = torch.linalg.svdvals(weight)
    error = torch.linalg.matrix_norm(weight - a @ b)  # Eckart-Young: sqrt of the dropped sigma^2
    torch.testing.assert_close(error, sigma[5:].square().sum().sqrt(), atol=1e-4, rtol=1e-4)


def test_factor_signs_are_canonical() -> None:
    torch.manual_seed(1)
    weight = torch.randn(8, 6)
    a, b = lowrank.factorize(weight, 4)
    pivots = a.abs().argmax(dim=0)
    assert (a[pivots, torch.arange(4)] > 0).all()  # the largest entry of every column of A is positive
    u, s, vh = torch.linalg.svd(weight, full_matrices=False)
    torch.testing.assert_close(a @ b, (u[:, :4] * s[:4]) @ vh[:4], atol=1e-5, rtol=1e-5)


def test_factored_module_computes_with_factors_and_merges_back() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3))
    ref = lowrank.WeightRef("1", "weight")
    x = torch.randn(4, 6)
    expected = model(x)
    lowrank.factor(model, ref, rank=6)
    a, b = lowrank.factors(model, ref)
    assert a.shape == (6, 6) and b.shape == (6, 6)
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        a.mul_(2.0)
    lowrank.merge(model, ref)
    assert not lowrank.is_factored(model, ref)
    assert isinstance(model[1].weight, nn.Parameter)
    torch.testing.assert_close(model[1].weight, (a @ b).detach())
