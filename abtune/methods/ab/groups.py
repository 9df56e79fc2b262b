"""Independent groups: contiguous blocks of ranks; the first half of the groups trains A, the second B.

The number of groups must be even, so A ranks = B ranks (Algorithm 1 splits the ranks in halves).

A natural group is one node, so AB's independent phase never crosses the interconnect. The group
size is chosen and checked against the layout by `AbConfig.resolved_group_size`, before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch.distributed as dist

from abtune.comm import CommGroup, CommMeter


class Target(StrEnum):
    A = "A"
    B = "B"


@dataclass(frozen=True)
class ABGroups:
    group_size: int
    num_groups: int
    index: int  # this rank's group
    target: Target  # the factor this rank trains during the AB phase
    group: CommGroup  # this rank's group
    a_ranks: tuple[int, ...]
    b_ranks: tuple[int, ...]


def target_of_group(index: int, num_groups: int) -> Target:
    return Target.A if index < num_groups // 2 else Target.B


def build_groups(meter: CommMeter, rank: int, group_size: int) -> ABGroups:
    """Create one process group per block of ranks. Every rank must call this (new_group is collective)."""
    world_size = meter.topology.world_size
    num_groups = world_size // group_size
    blocks = [tuple(range(g * group_size, (g + 1) * group_size)) for g in range(num_groups)]
    handles = [dist.new_group(list(block)) for block in blocks]
    index = rank // group_size
    a_ranks = tuple(r for g, block in enumerate(blocks) if target_of_group(g, num_groups) is Target.A for r in block)
    b_ranks = tuple(r for r in range(world_size) if r not in a_ranks)
    group = meter.group(f"ab_group{index}", blocks[index], handles[index])
    return ABGroups(group_size, num_groups, index, target_of_group(index, num_groups), group, a_ranks, b_ranks)
