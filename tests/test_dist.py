"""Which device a rank trains on, for the ways clusters show GPUs to a task."""

from __future__ import annotations

import pytest
import torch

from abtune.dist import choose_device
from abtune.errors import ConfigError


@pytest.mark.parametrize(
    ("local_rank", "visible_gpus", "expected"),
    [
        (0, 0, torch.device("cpu")),  # no GPU: gloo on the CPU
        (3, 0, torch.device("cpu")),
        (0, 4, torch.device("cuda", 0)),  # --gpus-per-node: every task sees the node's 4 GPUs
        (3, 4, torch.device("cuda", 3)),
        (3, 1, torch.device("cuda", 0)),  # --gpus-per-task: each task sees only its own GPU
    ],
)
def test_each_rank_gets_its_own_device(local_rank: int, visible_gpus: int, expected: torch.device) -> None:
    assert choose_device(local_rank, visible_gpus) == expected


def test_a_rank_without_a_gpu_of_its_own_is_refused() -> None:
    # used to fall back to the CPU and gloo on that rank alone, while its peers used NCCL
    with pytest.raises(ConfigError, match=r"local rank 2 has no GPU of its own: this task sees 2 GPUs"):
        choose_device(2, 2)
