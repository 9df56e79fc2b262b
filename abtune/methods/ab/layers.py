"""Layers that hold a weight as two factors W = A·B and compute in low rank.

`lowrank.factor` swaps one of these in for a dense layer when an AB phase begins and `lowrank.merge`
swaps the dense layer back at the sync; the model's code stays dense and unaware. A factored m x n weight
(a conv's viewed as C_out x C_in·kh·kw) is held as A (m x r) and B (r x n), the parameters `<attr>_a` and
`<attr>_b`; the dense weight is gone. When r(m+n) < mn the layer computes with two thin products, x·Bᵀ
then ·Aᵀ (a conv: a kh x kw convolution into r channels, then a 1 x 1 convolution); otherwise (with
`rank_cap: null` the factors may outgrow W) it forms A·B and runs the dense product, the cheaper of the
two. Every other parameter is the dense layer's own tensor under its own name, so its optimizer state
and its place in a dense state dict survive the swap.

torchvision's ViT calls `nn.MultiheadAttention`, whose forward hands `in_proj_weight` and
`out_proj.weight` to a functional kernel as tensors; an attention with a factored projection is swapped
for `FactoredAttention`, which calls its projections as modules and then
`F.scaled_dot_product_attention`, as `nn.MultiheadAttention` does for self-attention without masks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FLOPS_PER_MULTIPLY_ADD = 2


def computes_thin(shape: torch.Size, rank: int) -> bool:
    """Whether x·Bᵀ·Aᵀ costs fewer multiply-adds than x·(A·B)ᵀ for a weight of `shape` (viewed as m x n)."""
    m, n = shape[0], math.prod(shape[1:])
    return rank * (m + n) < m * n


@dataclass(frozen=True)
class _Factored:
    shape: torch.Size  # the dense weight's
    rank: int
    thin: bool


class FactoredLayer(nn.Module, ABC):
    """The part every factored layer shares: its factors, and the dense layer it was made from.

    The dense layer is kept aside (not a submodule: it is not trained, saved or moved) without its
    factored weights, so that `merge` can give it back its own class, settings and other parameters.
    """

    def __init__(self, dense: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_dense", dense)
        self._factored: dict[str, _Factored] = {}

    def _hold_factors(self, attr: str, a: torch.Tensor, b: torch.Tensor, thin: bool | None) -> None:
        """Hold `attr` as A·B; `thin`: compute with the thin products (None: whenever they are cheaper)."""
        shape, rank = getattr(self._dense, attr).shape, a.shape[1]
        delattr(self._dense, attr)
        self._parameters.pop(attr, None)
        self._factored[attr] = _Factored(shape, rank, computes_thin(shape, rank) if thin is None else thin)
        self.register_parameter(f"{attr}_a", nn.Parameter(a))
        self.register_parameter(f"{attr}_b", nn.Parameter(b))

    def is_factored(self, attr: str) -> bool:
        return attr in self._factored

    def factors(self, attr: str) -> tuple[nn.Parameter, nn.Parameter]:
        return self._parameters[f"{attr}_a"], self._parameters[f"{attr}_b"]  # type: ignore[return-value]

    def dense_shape(self, attr: str) -> torch.Size:
        return self._factored[attr].shape

    def product(self, attr: str) -> torch.Tensor:
        a, b = self.factors(attr)
        return (a @ b).view(self.dense_shape(attr))

    def merge(self, attr: str) -> None:
        """Replace the factors of `attr` by the dense weight A·B, a new parameter (of this layer and the dense one)."""
        with torch.no_grad():
            weight = nn.Parameter(self.product(attr))
        del self._factored[attr]
        del self._parameters[f"{attr}_a"], self._parameters[f"{attr}_b"]
        self._dense.register_parameter(attr, weight)
        self.register_parameter(attr, weight)

    @property
    def holds_factors(self) -> bool:
        return bool(self._factored)

    def dense(self) -> nn.Module:
        """The dense layer, with every weight merged back (see `merge`)."""
        assert not self.holds_factors, "merge every factored weight first"
        return self._dense

    def product_flops(self, attr: str, rows: int) -> tuple[int, int]:
        """Forward FLOPs of `attr`'s product over `rows` input vectors: (dense, as this layer computes it)."""
        factored = self._factored[attr]
        m, n = factored.shape[0], math.prod(factored.shape[1:])
        dense = FLOPS_PER_MULTIPLY_ADD * rows * m * n
        if factored.thin:
            return dense, FLOPS_PER_MULTIPLY_ADD * rows * factored.rank * (m + n)
        return dense, dense + FLOPS_PER_MULTIPLY_ADD * m * n * factored.rank  # forming A·B, once a forward

    @abstractmethod
    def forward_flops(self, inputs: tuple[Any, ...], output: Any) -> tuple[int, int]:
        """The factored products' forward FLOPs of one call (its `inputs` and `output`): (dense, computed)."""

    def _linear(self, attr: str, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x·Wᵀ + bias with W = A·B held as `attr`'s factors."""
        if self._factored[attr].thin:
            a, b = self.factors(attr)
            return F.linear(F.linear(x, b), a, bias)
        return F.linear(x, self.product(attr), bias)

    def extra_repr(self) -> str:
        return ", ".join(f"{attr}: {tuple(f.shape)} at rank {f.rank}{' (thin)' if f.thin else ''}"
                         for attr, f in self._factored.items())


class FactoredLinear(FactoredLayer):
    """y = (x·Bᵀ)·Aᵀ + bias."""

    def __init__(self, dense: nn.Linear, a: torch.Tensor, b: torch.Tensor, thin: bool | None = None) -> None:
        super().__init__(dense)
        self.bias = dense.bias
        self._hold_factors("weight", a, b, thin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear("weight", x, self.bias)

    def forward_flops(self, inputs: tuple[Any, ...], output: Any) -> tuple[int, int]:
        return self.product_flops("weight", output.numel() // output.shape[-1])


class FactoredConv2d(FactoredLayer):
    """A kh x kw convolution with B's r filters, then a 1 x 1 convolution with A (groups of 1; a grouped
    convolution forms A·B)."""

    def __init__(self, dense: nn.Conv2d, a: torch.Tensor, b: torch.Tensor, thin: bool | None = None) -> None:
        super().__init__(dense)
        self.bias = dense.bias
        self._hold_factors("weight", a, b, False if dense.groups != 1 else thin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv: nn.Conv2d = self._dense
        padding = conv.padding
        if conv.padding_mode != "zeros":
            x, padding = F.pad(x, conv._reversed_padding_repeated_twice, mode=conv.padding_mode), 0
        if self._factored["weight"].thin:
            a, b = self.factors("weight")
            rank, (height, width) = b.shape[0], conv.kernel_size
            x = F.conv2d(x, b.view(rank, -1, height, width), None, conv.stride, padding, conv.dilation)
            return F.conv2d(x, a.view(a.shape[0], rank, 1, 1), self.bias)
        return F.conv2d(x, self.product("weight"), self.bias, conv.stride, padding, conv.dilation, conv.groups)

    def forward_flops(self, inputs: tuple[Any, ...], output: Any) -> tuple[int, int]:
        return self.product_flops("weight", output.numel() // output.shape[-3])


class FactoredAttention(FactoredLayer):
    """`nn.MultiheadAttention`'s self-attention without masks (as torchvision's ViT calls it) with the
    projections called as modules: the input projection dense or factored (`factor_in_proj`), `out_proj`
    a Linear or a FactoredLinear."""

    def __init__(self, dense: nn.MultiheadAttention) -> None:
        super().__init__(dense)
        if dense.in_proj_weight is None or dense.bias_k is not None or dense.add_zero_attn:
            raise NotImplementedError("a factored attention needs one packed input projection, without bias_k, "
                                      "bias_v or add_zero_attn")
        for name, param in dense.named_parameters(recurse=False):
            self.register_parameter(name, param)
        self.out_proj = dense.out_proj
        self.num_heads, self.dropout, self.batch_first = dense.num_heads, dense.dropout, dense.batch_first

    def factor_in_proj(self, a: torch.Tensor, b: torch.Tensor, thin: bool | None = None) -> None:
        self._hold_factors("in_proj_weight", a, b, thin)

    @property
    def holds_factors(self) -> bool:
        return bool(self._factored) or isinstance(self.out_proj, FactoredLayer)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        if key is not query or value is not query or query.dim() != 3 or need_weights or is_causal \
                or key_padding_mask is not None or attn_mask is not None:
            raise NotImplementedError("a factored attention computes batched self-attention without masks and "
                                      "without attention weights (call it as (x, x, x, need_weights=False))")
        x = query.transpose(0, 1) if self.batch_first else query  # (L, N, E), as nn.MultiheadAttention
        length, batch, embed = x.shape
        q, k, v = self._in_projection(x).unflatten(-1, (3, embed)).movedim(-2, 0).contiguous()
        heads = [t.view(length, batch * self.num_heads, -1).transpose(0, 1).view(batch, self.num_heads, length, -1)
                 for t in (q, k, v)]
        attended = F.scaled_dot_product_attention(*heads, dropout_p=self.dropout if self.training else 0.0)
        attended = attended.permute(2, 0, 1, 3).contiguous().view(batch * length, embed)
        out = self.out_proj(attended).view(length, batch, -1)
        return (out.transpose(0, 1) if self.batch_first else out), None

    def _in_projection(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_factored("in_proj_weight"):
            return self._linear("in_proj_weight", x, self.in_proj_bias)
        return F.linear(x, self.in_proj_weight, self.in_proj_bias)

    def forward_flops(self, inputs: tuple[Any, ...], output: Any) -> tuple[int, int]:
        if not self.is_factored("in_proj_weight"):
            return 0, 0
        query = inputs[0]
        return self.product_flops("in_proj_weight", query.numel() // query.shape[-1])
