"""A SLURM job pending for PartitionNodeLimit is given up from squeue's reason alone when sinfo cannot tell the
partition's nodes: a 6-node job on a 4-node cluster otherwise pends unseen for as long as anyone waits."""

from __future__ import annotations

import pytest

from abtune.launch.slurm import capacity

FOUR_NODES = "".join(f"n{i}|debug*|4|8000|(null)|infinite|1-infinite\n" for i in range(1, 5))


def _sinfo_answers(monkeypatch: pytest.MonkeyPatch, out: str | None) -> None:
    monkeypatch.setattr(capacity, "slurm_output", lambda *args, **kwargs: out)


def test_partition_node_limit_never_starts_when_sinfo_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    _sinfo_answers(monkeypatch, None)
    assert capacity.never_starts("PartitionNodeLimit", 6, "debug") == (
        "it pends for PartitionNodeLimit (it asks 6 node(s), more than partition debug has, allows a job or has up; "
        "sinfo could not tell which)")


def test_partition_node_limit_with_sinfo_gives_up_only_a_request_beyond_the_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _sinfo_answers(monkeypatch, FOUR_NODES)
    assert capacity.never_starts("PartitionNodeLimit", 6, "debug") == (
        "it pends for PartitionNodeLimit (it asks 6 node(s); partition debug has 4)")
    assert capacity.never_starts("PartitionNodeLimit", 3, "debug") is None  # nodes down or drained: it may clear
