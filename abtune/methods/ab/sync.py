"""Merging the independently trained groups into one model every rank agrees on.

Modes (what is averaged over all ranks):
- with-stale (Algorithm 1): A and B averaged over every rank, so each factor's mean includes the
  stale copies of the groups that did not train it.
- only-learned: A averaged over the A groups only, B over the B groups only (one all-reduce of
  the same size: each rank contributes the factor it learned and zeros for the other).
- full: every rank rebuilds W = A.B first and the full-rank weights are averaged (more bytes).
Non-factored parameters (biases, norms, head, embeddings) and floating buffers (batch-norm
statistics) are always averaged over all ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from abtune.comm import CommGroup, CommMeter, average_tensors_
from abtune.methods.ab.groups import ABGroups, Target
from abtune.methods.ab.lowrank import WeightRef, dense_shape, factors


def _unfactored_state(model: nn.Module, refs: list[WeightRef]) -> dict[str, torch.Tensor]:
    """Every parameter but the factors, and every buffer, under their names in the dense model."""
    factor_ids = {id(f) for ref in refs for f in factors(model, ref)}
    state = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) not in factor_ids}
    state.update({n: b.detach().clone() for n, b in model.named_buffers()})
    return state


def _product(a: torch.Tensor, b: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return (a @ b).view(shape)


def merged_state(
    model: nn.Module,
    refs: list[WeightRef],
    mode: str | None,
    groups: ABGroups | None,
    meter: CommMeter,
    world: CommGroup,
) -> dict[str, torch.Tensor]:
    """The dense state dict of the merged model; `model` itself is not changed.

    `mode=None` means the ranks never diverged (no groups): nothing is exchanged.
    """
    state = _unfactored_state(model, refs)
    pairs = {ref.key: [f.detach().clone() for f in factors(model, ref)] for ref in refs}
    shapes = {ref.key: dense_shape(model, ref) for ref in refs}
    if mode == "full":
        products = {k: _product(a, b, shapes[k]) for k, (a, b) in pairs.items()}
        average_tensors_(meter, [*products.values(), *state.values()], world)
        return {**state, **products}
    if mode == "with-stale":
        average_tensors_(meter, [f for pair in pairs.values() for f in pair] + list(state.values()), world)
    elif mode == "only-learned":
        assert groups is not None
        _average_learned_factors(pairs, groups, meter, world)
        average_tensors_(meter, list(state.values()), world)
    elif mode is not None:
        raise ValueError(f"unknown sync mode {mode!r}")
    return {**state, **{k: _product(a, b, shapes[k]) for k, (a, b) in pairs.items()}}


def _average_learned_factors(
    pairs: dict[str, list[torch.Tensor]], groups: ABGroups, meter: CommMeter, world: CommGroup
) -> None:
    learned = 0 if groups.target is Target.A else 1
    contributions = []
    for pair in pairs.values():
        pair[1 - learned].zero_()
        contributions.extend(pair)
    average_tensors_(meter, contributions, world, divide_by=1)  # a plain sum
    for pair in pairs.values():
        pair[0].div_(len(groups.a_ranks))
        pair[1].div_(len(groups.b_ranks))
