"""Networks, built by name from `ModelConfig` and the data set's `DatasetInfo`.

Plain torch modules: nothing here knows about distribution or low rank.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import cast

import torch
from torch import nn
from torchvision import models

from abtune.config import ModelConfig
from abtune.data import RGB_CHANNELS, DatasetInfo
from abtune.errors import ConfigError

VIT_B_16_PATCH = 16
VGG_POOL_STAGES = 5  # vgg16 halves the image five times, so it needs at least 2**5 pixels
SMALL_CNN_WIDTHS = (16, 32, 64)  # channels of the three conv layers; the later two have stride 2
SMALL_CNN_KERNEL = 3
FLOP_COUNT_BATCH = 2
QKV = 3  # nn.MultiheadAttention stacks the query, key and value projections in in_proj_weight

# (first layer, classification head) of each architecture, as in `model.named_modules()`: the
# layers that take the image and that give the logits.
INPUT_AND_HEAD_LAYERS: dict[str, tuple[str, str]] = {
    "vit": ("conv_proj", "heads.head"),
    "vit_b_16": ("conv_proj", "heads.head"),
    "resnet18": ("conv1", "fc"),
    "resnet50": ("conv1", "fc"),
    "vgg16": ("features.0", "classifier.6"),
    "small_cnn": ("stem.conv", "head"),
}


def build_model(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
    model = MODEL_BUILDERS[cfg.arch](cfg, info)
    if cfg.init == "orthogonal":
        orthogonal_init(model)
    elif cfg.init == "trunc_normal":
        trunc_normal_init(model, cfg.trunc_normal_std)
    return model


def forward_flops_per_sample(cfg: ModelConfig, info: DatasetInfo) -> int:
    """FLOPs of one sample's forward pass as training runs it (torch's flop counter: matrix products,
    attention and convolutions, 2 per multiply-add); the cluster time model scales compute with it.

    Counted on the meta device (shapes only, no arithmetic) in training mode: in `eval()` under no_grad,
    nn.MultiheadAttention takes a fused fast path whose projections and attention products the counter
    does not see, and on the CPU the counter does not see the fused attention kernel; on the meta device
    attention runs as the plain matrix products the counter knows. Initialization changes no FLOP."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = MODEL_BUILDERS[cfg.arch](cfg, info).train()
        # two samples: BatchNorm in training mode refuses one on a 1x1 feature map
        images = torch.zeros(FLOP_COUNT_BATCH, info.in_channels, info.image_size, info.image_size)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(images)
    return int(counter.get_total_flops()) // FLOP_COUNT_BATCH


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def orthogonal_init(model: nn.Module) -> None:
    """Orthogonal weights for every Linear and Conv layer, including the query, key and value
    projections that nn.MultiheadAttention keeps in one matrix (each initialized on its own, as
    if they were three Linear layers). Biases, norms and embeddings keep their initialization."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.orthogonal_(module.weight)
            elif isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
                for projection in module.in_proj_weight.chunk(QKV):
                    nn.init.orthogonal_(projection)


def trunc_normal_init(model: nn.Module, std: float) -> None:
    """Every Linear weight and attention input projection from N(0, std^2) truncated at +-2 std,
    their biases zero, as timm initializes its ViTs. Small weights let training, not the random
    start, shape their spectra: what AB's sigma cutoff then finds at its first decomposition.
    Conv layers (the patch embedding, never factored), norms and embeddings keep their initialization."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                _trunc_normal(module.weight, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
                _trunc_normal(module.in_proj_weight, std)
                if module.in_proj_bias is not None:
                    nn.init.zeros_(module.in_proj_bias)


def _trunc_normal(weight: torch.Tensor, std: float) -> None:
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


# --- builders -----------------------------------------------------------------------------------


def _vit(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
    if info.image_size % cfg.patch_size:
        raise ConfigError(
            f"model.patch_size: {cfg.patch_size} must divide the image size {info.image_size} of data set "
            f"{info.name}; choose a divisor or set data.image_size"
        )
    model = models.VisionTransformer(
        image_size=info.image_size,
        patch_size=cfg.patch_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        hidden_dim=cfg.hidden_dim,
        mlp_dim=cfg.mlp_dim,
        dropout=cfg.dropout,
        attention_dropout=cfg.dropout,
        num_classes=info.num_classes,
    )
    return _vit_in_channels(model, info.in_channels)


def _vit_b_16(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
    if info.image_size % VIT_B_16_PATCH:
        raise ConfigError(
            f"model.arch: vit_b_16 cuts {VIT_B_16_PATCH}-pixel patches, which must divide the image size "
            f"{info.image_size} of data set {info.name}; set data.image_size to a multiple of {VIT_B_16_PATCH}"
        )
    model = models.vit_b_16(
        weights=None,
        image_size=info.image_size,
        num_classes=info.num_classes,
        dropout=cfg.dropout,
        attention_dropout=cfg.dropout,
    )
    return _vit_in_channels(model, info.in_channels)


def _vit_in_channels(model: models.VisionTransformer, in_channels: int) -> models.VisionTransformer:
    if in_channels != RGB_CHANNELS:
        old = model.conv_proj
        model.conv_proj = _conv_like(old, in_channels)
        # torchvision's initialization of the patch embedding
        fan_in = in_channels * old.kernel_size[0] * old.kernel_size[1]
        nn.init.trunc_normal_(model.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(model.conv_proj.bias)
    return model


def _resnet(factory: Callable[..., models.ResNet]) -> Callable[[ModelConfig, DatasetInfo], nn.Module]:
    def build(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
        if cfg.dropout:
            raise ConfigError(f"model.dropout: {cfg.arch} has no dropout layers; set model.dropout: 0")
        model = factory(weights=None, num_classes=info.num_classes)
        if info.in_channels != RGB_CHANNELS:
            model.conv1 = _conv_like(model.conv1, info.in_channels)
        return model

    return build


def _vgg16(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
    min_size = 2**VGG_POOL_STAGES
    if info.image_size < min_size:
        raise ConfigError(
            f"model.arch: vgg16 halves the image {VGG_POOL_STAGES} times and needs at least {min_size} "
            f"pixels, but data set {info.name} has {info.image_size}; set data.image_size: {min_size}"
        )
    # model.dropout replaces torchvision's default of 0.5 in the classifier
    model = models.vgg16(weights=None, num_classes=info.num_classes, dropout=cfg.dropout)
    if info.in_channels != RGB_CHANNELS:
        model.features[0] = _conv_like(model.features[0], info.in_channels)
    return model


def _small_cnn(cfg: ModelConfig, info: DatasetInfo) -> nn.Module:
    """Three conv-BatchNorm-ReLU blocks, global average pooling and a linear head."""
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    channels = info.in_channels
    for index, width in enumerate(SMALL_CNN_WIDTHS):
        name = "stem" if index == 0 else f"block{index}"
        blocks[name] = _conv_bn_relu(channels, width, stride=1 if index == 0 else 2)
        channels = width
    blocks["pool"] = nn.AdaptiveAvgPool2d(1)
    blocks["flatten"] = nn.Flatten()
    blocks["dropout"] = nn.Dropout(cfg.dropout)
    blocks["head"] = nn.Linear(channels, info.num_classes)
    return nn.Sequential(blocks)


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    conv = nn.Conv2d(
        in_channels, out_channels, SMALL_CNN_KERNEL, stride=stride, padding=SMALL_CNN_KERNEL // 2, bias=False
    )
    return nn.Sequential(OrderedDict(conv=conv, bn=nn.BatchNorm2d(out_channels), relu=nn.ReLU(inplace=True)))


def _conv_like(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """`conv` with another number of input channels (PyTorch's default initialization)."""
    two_d = tuple[int, int]  # what Conv2d stores its sizes as
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        cast(two_d, conv.kernel_size),
        stride=cast(two_d, conv.stride),
        padding=cast(two_d | str, conv.padding),
        bias=conv.bias is not None,
    )


MODEL_BUILDERS: dict[str, Callable[[ModelConfig, DatasetInfo], nn.Module]] = {
    "vit": _vit,
    "vit_b_16": _vit_b_16,
    "resnet18": _resnet(models.resnet18),
    "resnet50": _resnet(models.resnet50),
    "vgg16": _vgg16,
    "small_cnn": _small_cnn,
}
