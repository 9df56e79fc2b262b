"""Low-rank factors of weight matrices: which weights, which rank, and the swap to layers holding W = A.B.

A weight is viewed as a matrix (conv: C_out x C_in*kh*kw). Its fp32 SVD gives
A = U sqrt(S) and B = sqrt(S) V^T, truncated to the rank r = #{sigma_i > cutoff * sigma_max}.
`factor` swaps the module that owns the weight for a factored layer (`abtune.methods.ab.layers`) whose
parameters `<attr>_a`, `<attr>_b` are A and B and which computes in low rank; `merge` swaps it back.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from abtune.methods.ab import layers

FACTORED_MODULES = (nn.Linear, nn.Conv2d)


@dataclass(frozen=True)
class WeightRef:
    """One weight that AB-training factors: the module that owns it and the attribute name."""

    module_name: str
    attr: str

    @property
    def key(self) -> str:
        return f"{self.module_name}.{self.attr}" if self.module_name else self.attr

    def module(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.module_name)


def eligible_weights(model: nn.Module, keep_full_rank: tuple[str, ...] = ()) -> list[WeightRef]:
    """Linear and Conv2d weights and attention input projections, minus what stays full rank.

    Always full rank: the first layer that sees the input (patch embedding / first conv) and the
    classifier head (the last Linear), plus every module whose name matches a `keep_full_rank` glob.
    Class token, position embedding, biases and norms are never factored: they are not matrices.
    """
    candidates: list[WeightRef] = []
    for name, module in model.named_modules():
        if isinstance(module, FACTORED_MODULES) and module.weight.dim() >= 2:
            candidates.append(WeightRef(name, "weight"))
        elif isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
            candidates.append(WeightRef(name, "in_proj_weight"))
    first = next((c for c in candidates if isinstance(c.module(model), nn.Conv2d)), None)
    head = next((c for c in reversed(candidates) if isinstance(c.module(model), nn.Linear)), None)
    return [
        c
        for c in candidates
        if c not in (first, head) and not any(fnmatch.fnmatchcase(c.module_name, p) for p in keep_full_rank)
    ]


def as_matrix(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().reshape(weight.shape[0], -1).float()


SVD = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def svd(weight: torch.Tensor) -> SVD:
    """fp32 thin SVD (U, S, Vh) of the weight viewed as a matrix."""
    u, s, vh = torch.linalg.svd(as_matrix(weight), full_matrices=False)
    return u, s, vh


def rank_for_cutoff(sigma: torch.Tensor, cutoff: float) -> int:
    return max(1, int((sigma > cutoff * sigma[0]).sum()))


def max_factored_rank(shape: torch.Size, cap: float | None) -> int:
    """The largest rank at which a weight of `shape` (viewed as m x n) is factored under `cap`.

    Equation 1 only asks k < min(m, n); what saves parameters and traffic is r(m+n) < mn, which is
    stricter. `cap` is the largest share of W's entries the factors may hold (abtune's addition);
    None factors every weight whatever its rank, as the paper's Algorithm 1 and the authors' code
    do (A and B may then hold more entries than W). 0: never factored.
    """
    m, n = shape[0], math.prod(shape[1:])
    if cap is None:
        return min(m, n)
    smaller = (m * n - 1) // (m + n)  # r(m+n) < mn
    return min(smaller, math.floor(cap * m * n / (m + n)))


def factors_fit(shape: torch.Size, rank: int, cap: float | None) -> bool:
    """Whether rank-`rank` factors of a weight of `shape` are trained under `cap` (see `max_factored_rank`)."""
    return rank <= max_factored_rank(shape, cap)


def factoring_cutoff(sigma: torch.Tensor, max_rank: int) -> float | None:
    """The smallest sigma cutoff whose rank (`rank_for_cutoff`) is at most `max_rank`: sigma[r_max] / sigma_1.

    0.0: every cutoff factors the weight; None: no cutoff does (`max_rank` 0).
    """
    if max_rank < 1:
        return None
    if max_rank >= len(sigma):
        return 0.0
    return float(sigma[max_rank] / sigma[0])


@dataclass(frozen=True)
class WeightDecomposition:
    """What one decomposition decided for one weight, and why."""

    rank: int  # the rank the cutoff chose (agreed by all ranks)
    max_rank: int  # the largest rank the cap lets a factored weight have
    factored: bool
    factors_from_cutoff: float | None  # factored at every cutoff from this one up (None: never)

    def as_dict(self) -> dict[str, int | bool | float | None]:
        return {"rank": self.rank, "max_rank": self.max_rank, "factored": self.factored,
                "factors_from_cutoff": self.factors_from_cutoff}


def decide(shape: torch.Size, sigma: torch.Tensor, rank: int, cap: float | None) -> WeightDecomposition:
    """The decision for a weight of `shape`, spectrum `sigma`, whose agreed cutoff rank is `rank`."""
    max_rank = max_factored_rank(shape, cap)
    return WeightDecomposition(rank, max_rank, rank <= max_rank, factoring_cutoff(sigma, max_rank))


def factorize(weight: torch.Tensor, rank: int, decomposition: SVD | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A = U sqrt(S), B = sqrt(S) V^T of the best rank-`rank` approximation.

    Signs are made canonical (the largest-magnitude entry of each column of U is positive), so
    every rank that factors the same W gets the same A and B; averaging factors whose signs
    differ between ranks would destroy them. Pass `decomposition` (the `svd` of `weight`) when
    it is already known.
    """
    u, s, vh = decomposition if decomposition is not None else svd(weight)
    u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    pivot = u.abs().argmax(dim=0)
    signs = torch.sign(u[pivot, torch.arange(rank)])
    signs[signs == 0] = 1
    root = s.sqrt()
    a = (u * signs) * root
    b = (vh * signs[:, None]) * root[:, None]
    return a.to(weight.dtype).contiguous(), b.to(weight.dtype).contiguous()


def factor(model: nn.Module, ref: WeightRef, rank: int, decomposition: SVD | None = None,
           thin: bool | None = None) -> None:
    """Swap the module owning the weight for a factored layer holding it as A @ B of rank `rank` (from
    `decomposition`, the weight's `svd`, if given); `thin` as in `layers.FactoredLayer`. An attention whose
    input or output projection is factored becomes a `layers.FactoredAttention`."""
    module = ref.module(model)
    a, b = factorize(getattr(module, ref.attr), rank, decomposition)
    if isinstance(module, nn.MultiheadAttention | layers.FactoredAttention):
        _attention(model, ref.module_name).factor_in_proj(a, b, thin)
        return
    parent = _parent_name(ref)
    if parent is not None and isinstance(model.get_submodule(parent), nn.MultiheadAttention):
        _attention(model, parent)
    kind = layers.FactoredConv2d if isinstance(module, nn.Conv2d) else layers.FactoredLinear
    _replace(model, ref.module_name, kind(module, a, b, thin))


def merge(model: nn.Module, ref: WeightRef) -> None:
    """Replace the factors by the full-rank weight A @ B (a new parameter); a layer with nothing left
    factored becomes the dense module it was."""
    layer = _factored_layer(model, ref)
    layer.merge(ref.attr)
    if not layer.holds_factors:
        _replace(model, ref.module_name, layer.dense())
    parent = _parent_name(ref)
    if parent is not None:
        attention = model.get_submodule(parent)
        if isinstance(attention, layers.FactoredAttention) and not attention.holds_factors:
            _replace(model, parent, attention.dense())


def factors(model: nn.Module, ref: WeightRef) -> tuple[nn.Parameter, nn.Parameter]:
    return _factored_layer(model, ref).factors(ref.attr)


def dense_shape(model: nn.Module, ref: WeightRef) -> torch.Size:
    """The original shape of a factored weight, without computing A @ B."""
    return _factored_layer(model, ref).dense_shape(ref.attr)


def is_factored(model: nn.Module, ref: WeightRef) -> bool:
    module = ref.module(model)
    return isinstance(module, layers.FactoredLayer) and module.is_factored(ref.attr)


def _factored_layer(model: nn.Module, ref: WeightRef) -> layers.FactoredLayer:
    module = ref.module(model)
    assert isinstance(module, layers.FactoredLayer) and module.is_factored(ref.attr), f"{ref.key} is not factored"
    return module


def _attention(model: nn.Module, name: str) -> layers.FactoredAttention:
    module = model.get_submodule(name)
    if isinstance(module, nn.MultiheadAttention):
        module = layers.FactoredAttention(module)
        _replace(model, name, module)
    assert isinstance(module, layers.FactoredAttention)
    return module


def _parent_name(ref: WeightRef) -> str | None:
    return ref.module_name.rpartition(".")[0] if ref.module_name else None


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def count_product_flops(model: nn.Module, done: Callable[[dict[str, int]], None]) -> None:
    """In the model's next forward, the FLOPs a sample of the factored weights' products, dense and as the
    factored layers compute them: `done({"dense": ..., "factored": ...})` after it."""
    tally = {"dense": 0, "factored": 0}
    batch: list[int] = []

    def before(module: nn.Module, args: tuple[Any, ...]) -> None:
        batch.append(args[0].shape[0])

    def count(layer: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        dense, factored = cast(layers.FactoredLayer, layer).forward_flops(args, output)
        tally["dense"], tally["factored"] = tally["dense"] + dense, tally["factored"] + factored

    def after(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        for handle in handles:
            handle.remove()
        done({key: round(value / batch[0]) for key, value in tally.items()})

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    handles += [m.register_forward_hook(count) for m in model.modules() if isinstance(m, layers.FactoredLayer)]


_OLD_FACTOR_NAME = re.compile(r"^(?P<prefix>(?:.*\.)?)parametrizations\.(?P<attr>[^.]+)\.original(?P<which>[01])$")


def current_parameter_name(name: str) -> str:
    """A parameter's name as this code registers it, given its name in a checkpoint of earlier versions
    (which held A and B as torch parametrizations: `<module>.parametrizations.<attr>.original0/1`)."""
    match = _OLD_FACTOR_NAME.match(name)
    if match is None:
        return name
    return f"{match['prefix']}{match['attr']}_{'ab'[int(match['which'])]}"
