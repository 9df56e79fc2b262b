from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.errors import ConfigError
from abtune.models import INPUT_AND_HEAD_LAYERS, build_model, forward_flops_per_sample, parameter_count

DIGITS = DatasetInfo(num_classes=10, image_size=8, in_channels=3, name="digits")
CIFAR10 = DatasetInfo(num_classes=10, image_size=32, in_channels=3, name="cifar10")
CIFAR100 = DatasetInfo(num_classes=100, image_size=32, in_channels=3, name="cifar100")
IMAGENET = DatasetInfo(num_classes=1000, image_size=224, in_channels=3, name="imagenet")
TINY_VIT = ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
BATCH = 2


REFERENCE_ARCHS = ("vit_b_16", "resnet50", "vgg16")  # 25-134M weights: what these tests read of them is shapes


@pytest.fixture(scope="module")
def built() -> Callable[[ModelConfig, DatasetInfo], nn.Module]:
    """Builds each (config, data set) once per module; the reference models on the meta device (shapes only,
    no weights to initialize: seconds of CPU each on the CPU)."""
    cache: dict[tuple[ModelConfig, DatasetInfo], nn.Module] = {}

    def get(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
        if (cfg, info) not in cache:
            with torch.device("meta" if cfg.arch in REFERENCE_ARCHS else "cpu"):
                cache[(cfg, info)] = build_model(cfg, info)
        return cache[(cfg, info)]

    return get


def logits(model: nn.Module, info: DatasetInfo) -> torch.Tensor:
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(torch.randn(BATCH, info.in_channels, info.image_size, info.image_size, device=device))


@pytest.mark.parametrize(
    "cfg, info",
    [
        (TINY_VIT, DIGITS),
        (TINY_VIT, CIFAR100),
        (ModelConfig(arch="small_cnn"), DIGITS),
        (ModelConfig(arch="small_cnn"), CIFAR100),
        (ModelConfig(arch="resnet18"), DIGITS),
        (ModelConfig(arch="resnet18"), CIFAR10),
        (ModelConfig(arch="vgg16"), CIFAR10),
    ],
    ids=lambda value: getattr(value, "arch", None) or value.name,
)
def test_logits_shape(built: Callable[..., nn.Module], cfg: ModelConfig, info: DatasetInfo) -> None:
    assert logits(built(cfg, info), info).shape == (BATCH, info.num_classes)


@pytest.mark.parametrize(
    "cfg", [TINY_VIT, ModelConfig(arch="small_cnn"), ModelConfig(arch="resnet18")], ids=lambda cfg: cfg.arch
)
def test_one_channel_input(cfg: ModelConfig) -> None:
    gray = DatasetInfo(num_classes=5, image_size=8, in_channels=1)
    assert logits(build_model(cfg, gray), gray).shape == (BATCH, 5)


def test_mini_vit_parameter_count(built: Callable[..., nn.Module]) -> None:
    # The paper's mini ViT (ModelConfig defaults): patch 8, 6 layers, 6 heads, hidden 768, MLP 3072;
    # CIFAR-100: 32x32 images, 100 classes. With h = 768, m = 3072:
    #   patch embedding conv 3->h, kernel 8x8:   3*8*8*h + h             =    148,224
    #   class token:                             h                       =        768
    #   position embedding, (32/8)^2 + 1 = 17:   17*h                    =     13,056
    #   per encoder layer:
    #     2 LayerNorms:                          2 * 2h                  =      3,072
    #     attention in_proj (q, k, v):           3h*h + 3h               =  1,771,776
    #     attention out_proj:                    h*h + h                 =    590,592
    #     MLP h->m->h:                           h*m + m + m*h + h       =  4,722,432
    #     layer total                                                    =  7,087,872
    #   6 layers:                                                        = 42,527,232
    #   final LayerNorm:                         2h                      =      1,536
    #   head h->100:                             100h + 100              =     76,900
    #   total: 148,224 + 768 + 13,056 + 42,527,232 + 1,536 + 76,900      = 42,767,716
    model = built(ModelConfig(), CIFAR100)
    assert parameter_count(model) == 42_767_716
    assert logits(model, CIFAR100).shape == (BATCH, 100)


@pytest.mark.parametrize(
    "arch, count",
    [
        # torchvision's documented sizes of the reference models (224x224, 1000 classes)
        ("vit_b_16", 86_567_656),
        ("resnet50", 25_557_032),
        ("resnet18", 11_689_512),
    ],
)
def test_reference_parameter_counts(built: Callable[..., nn.Module], arch: str, count: int) -> None:
    assert parameter_count(built(ModelConfig(arch=arch), IMAGENET)) == count


def test_vgg16_parameter_count(built: Callable[..., nn.Module]) -> None:
    # torchvision's documented 138,357,544 for 1000 classes, minus the 4096*990 + 990 parameters
    # of the 990 classes CIFAR-10 does not have.
    assert parameter_count(built(ModelConfig(arch="vgg16"), CIFAR10)) == 138_357_544 - 4096 * 990 - 990


def test_vit_b_16_takes_the_image_size_of_the_data_set(built: Callable[..., nn.Module]) -> None:
    model = built(ModelConfig(arch="vit_b_16"), CIFAR10)
    assert model.image_size == 32
    assert model.encoder.pos_embedding.shape == (1, (32 // 16) ** 2 + 1, 768)


def test_small_cnn_has_batch_norm_buffers() -> None:
    model = build_model(ModelConfig(arch="small_cnn"), DIGITS)
    norms = [module for module in model.modules() if isinstance(module, nn.BatchNorm2d)]
    convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
    assert len(norms) == len(convs) == 3
    model.train()
    model(torch.randn(4, 3, 8, 8))
    assert all(norm.num_batches_tracked.item() == 1 for norm in norms)
    assert not torch.equal(norms[0].running_mean, torch.zeros_like(norms[0].running_mean))


@pytest.mark.parametrize(
    "cfg, info",
    [
        (TINY_VIT, DIGITS),
        (ModelConfig(arch="small_cnn"), DIGITS),
        (ModelConfig(arch="resnet18"), DIGITS),
        (ModelConfig(arch="resnet50"), IMAGENET),
        (ModelConfig(arch="vgg16"), CIFAR10),
        (ModelConfig(arch="vit_b_16"), IMAGENET),
    ],
    ids=lambda value: getattr(value, "arch", None) or value.name,
)
def test_input_and_head_layers(built: Callable[..., nn.Module], cfg: ModelConfig, info: DatasetInfo) -> None:
    model = built(cfg, info)
    first, head = INPUT_AND_HEAD_LAYERS[cfg.arch]
    weighted = [name for name, module in model.named_modules() if isinstance(module, nn.Linear | nn.Conv2d)]
    assert (weighted[0], weighted[-1]) == (first, head)
    modules = dict(model.named_modules())
    assert modules[first].in_channels == info.in_channels
    assert modules[head].out_features == info.num_classes


def assert_orthogonal(weight: torch.Tensor) -> None:
    matrix = weight.detach().flatten(1)
    if matrix.shape[0] > matrix.shape[1]:
        matrix = matrix.T
    torch.testing.assert_close(matrix @ matrix.T, torch.eye(matrix.shape[0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", [TINY_VIT, ModelConfig(arch="small_cnn")], ids=lambda cfg: cfg.arch)
def test_orthogonal_init(cfg: ModelConfig) -> None:
    model = build_model(cfg.model_copy(update={"init": "orthogonal"}), DIGITS)
    checked = 0
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            assert_orthogonal(module.weight)
            checked += 1
        elif isinstance(module, nn.MultiheadAttention):
            for projection in module.in_proj_weight.chunk(3):  # query, key, value
                assert_orthogonal(projection)
                checked += 1
    assert checked > 0
    assert logits(model, DIGITS).shape == (BATCH, 10)


def test_default_init_is_not_orthogonal() -> None:
    model = build_model(TINY_VIT, DIGITS)
    with pytest.raises(AssertionError):
        assert_orthogonal(model.encoder.layers[0].mlp[0].weight)


def test_trunc_normal_init_draws_every_linear_and_projection_within_two_std() -> None:
    std = 0.004
    model = build_model(ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=4, hidden_dim=96, mlp_dim=192,
                                    init="trunc_normal", init_std=std), DIGITS)
    drawn = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    drawn += [m.in_proj_weight for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(drawn) == 2 * 4 + 1  # per layer: in and out projections, two MLP weights; and the head
    values = torch.cat([w.detach().flatten() for w in drawn])
    assert values.abs().max() <= 2 * std
    assert values.std().item() == pytest.approx(0.88 * std, rel=0.05)  # a normal truncated at 2 std: 0.88 std
    biases = [m.bias for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(not b.any() for b in biases)
    conv = model.conv_proj.weight  # the patch embedding keeps torchvision's initialization
    assert conv.abs().max() > 2 * std


def test_init_std_belongs_to_trunc_normal() -> None:
    assert ModelConfig(init="trunc_normal").trunc_normal_std == 0.02  # timm's default
    with pytest.raises(ValueError, match="init_std is the std of init: trunc_normal; with init: orthogonal"):
        ModelConfig(init="orthogonal", init_std=0.01)


def test_dropout_follows_the_config() -> None:
    model = build_model(TINY_VIT.model_copy(update={"dropout": 0.25}), DIGITS)
    rates = {module.p for module in model.modules() if isinstance(module, nn.Dropout)}
    assert rates == {0.25}
    assert model.encoder.layers[0].self_attention.dropout == 0.25


def test_patch_size_must_divide_image_size() -> None:
    with pytest.raises(
        ConfigError, match=r"model.patch_size: 3 must divide the image size 8 of data set digits"
    ):
        build_model(TINY_VIT.model_copy(update={"patch_size": 3}), DIGITS)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (ModelConfig(arch="vit_b_16"), "multiple of 16"),
        (ModelConfig(arch="vgg16"), "data.image_size: 32"),
        (ModelConfig(arch="resnet18", dropout=0.1), "model.dropout"),
    ],
    ids=lambda value: getattr(value, "arch", None) or value,
)
def test_unsupported_combinations(cfg: ModelConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(cfg, DIGITS)


# torchvision's model docs, GFLOPS (multiply-adds, at 224 px): pytorch.org/vision/stable/models/generated/
# torchvision.models.vit_b_16.html and .../torchvision.models.resnet50.html
TORCHVISION_GMACS = {"vit_b_16": 17.56, "resnet50": 4.09}


@pytest.mark.parametrize("arch", sorted(TORCHVISION_GMACS))
def test_forward_flops_are_counted_as_training_runs_the_model(arch: str) -> None:
    # 2 FLOPs a multiply-add; the attention products included (the eval fast path hid them: 22.5 GFLOP for vit_b_16)
    flops = forward_flops_per_sample(ModelConfig(arch=arch), IMAGENET)
    assert flops == pytest.approx(2 * TORCHVISION_GMACS[arch] * 1e9, rel=0.05)


def test_the_quickstart_vit_s_forward_flops_by_hand() -> None:
    cfg = ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=4, hidden_dim=96, mlp_dim=192)
    tokens, dim, mlp = (8 // 4) ** 2 + 1, 96, 192  # 4 patches and the class token
    patches = 4 * dim * (3 * 4 * 4)  # the patch embedding: a 4x4 conv over 3 channels per patch and output
    layer = tokens * (3 * dim * dim + dim * dim + 2 * dim * mlp)  # q, k, v, out projection, MLP
    attention = 2 * tokens * tokens * dim  # q k^T and the weighted sum of v, all heads together
    head = dim * 10
    assert forward_flops_per_sample(cfg, DIGITS) == 2 * (patches + 2 * (layer + attention) + head)
