"""Low-rank factors of weight matrices: which weights, which rank, and W = A.B as a parametrization.

A weight is viewed as a matrix (conv: C_out x C_in*kh*kw). Its fp32 SVD gives
A = U sqrt(S) and B = sqrt(S) V^T, truncated to the rank r = #{sigma_i > cutoff * sigma_max}.
The module keeps working unchanged: `module.weight` becomes a view of A @ B (torch parametrize),
and A, B are ordinary parameters `module.parametrizations.weight.original0/1`.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

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


class LowRankProduct(nn.Module):
    """Parametrization W = (A @ B) viewed in the weight's original shape."""

    def __init__(self, shape: torch.Size, rank: int, decomposition: SVD | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.rank = rank
        self._decomposition = decomposition  # used once, when the parametrization is registered

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b).view(self.shape)

    def right_inverse(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        decomposition, self._decomposition = self._decomposition, None
        return factorize(weight, self.rank, decomposition)


def factor(model: nn.Module, ref: WeightRef, rank: int, decomposition: SVD | None = None) -> None:
    """Replace the weight by A @ B of rank `rank` (from `decomposition`, the weight's `svd`, if given)."""
    module = ref.module(model)
    shape = getattr(module, ref.attr).shape
    product = LowRankProduct(shape, rank, decomposition)
    parametrize.register_parametrization(module, ref.attr, product, unsafe=True)


def factors(model: nn.Module, ref: WeightRef) -> tuple[nn.Parameter, nn.Parameter]:
    originals = ref.module(model).parametrizations[ref.attr]
    return originals.original0, originals.original1


def dense_shape(model: nn.Module, ref: WeightRef) -> torch.Size:
    """The original shape of a factored weight, without computing A @ B."""
    return ref.module(model).parametrizations[ref.attr][0].shape


def merge(model: nn.Module, ref: WeightRef) -> None:
    """Replace the factors by the full-rank weight A @ B (a new parameter)."""
    parametrize.remove_parametrizations(ref.module(model), ref.attr, leave_parametrized=True)


def is_factored(model: nn.Module, ref: WeightRef) -> bool:
    return parametrize.is_parametrized(ref.module(model), ref.attr)
