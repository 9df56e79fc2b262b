"""The inter-node model: which bytes of a collective leave a node, from gloo's algorithm (rings for
all-reduce and all-gather, a binomial tree for broadcast) and the placement of the group's ranks. The
numbers are those the emulated interconnect's link counters showed (benchmarks/bench_gloo_algorithms.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from abtune import wire
from abtune.comm import GROUP_MEAN_INTER, CommMeter, Op, Topology, broadcast_children
from abtune.errors import ConfigError
from abtune.study.spec import load_study_spec
from abtune.training.summary import time_to_target
from tests.study_helpers import TINY_BASE, write_study

TWO_BY_TWO = Topology((0, 0, 1, 1))
FOUR_BY_ONE = Topology((0, 1, 2, 3))
WORLD = (0, 1, 2, 3)
PAYLOAD = 1000


def per_node(topology: Topology, op: Op, ranks: tuple[int, ...] = WORLD, src: int = 0) -> list[float]:
    sent = [0.0] * topology.num_nodes
    for rank in range(topology.world_size):
        sent[topology.node_of_rank[rank]] += topology.inter_node_bytes(rank, op, PAYLOAD, ranks, src)
    return sent


def test_a_ring_all_reduce_crosses_only_on_the_hops_that_leave_a_node() -> None:
    assert per_node(TWO_BY_TWO, Op.ALL_REDUCE) == [1.5 * PAYLOAD, 1.5 * PAYLOAD]  # hops 2->1 and 0->3
    assert per_node(FOUR_BY_ONE, Op.ALL_REDUCE) == [1.5 * PAYLOAD] * 4
    assert per_node(TWO_BY_TWO, Op.ALL_REDUCE, ranks=(0, 1)) == [0.0, 0.0]  # a group inside node 0


def test_a_ring_all_gather_sends_n_minus_1_chunks_over_each_hop_that_leaves_a_node() -> None:
    assert per_node(TWO_BY_TWO, Op.ALL_GATHER) == [0.75 * PAYLOAD, 0.75 * PAYLOAD]
    assert per_node(FOUR_BY_ONE, Op.ALL_GATHER, ranks=(1, 2)) == [0.0, 0.5 * PAYLOAD, 0.5 * PAYLOAD, 0.0]


def test_a_broadcast_is_gloos_binomial_tree() -> None:
    assert broadcast_children(0, 4) == [1, 2] and broadcast_children(1, 4) == [3] and broadcast_children(2, 4) == []
    assert broadcast_children(0, 8) == [1, 2, 4] and broadcast_children(3, 8) == [7]
    assert per_node(TWO_BY_TWO, Op.BROADCAST) == [2 * PAYLOAD, 0.0]  # 0->2 and 1->3 leave node 0
    assert per_node(FOUR_BY_ONE, Op.BROADCAST) == [2 * PAYLOAD, PAYLOAD, 0.0, 0.0]
    # counted from the root: rank 2 sends to 3 (1 after it) and 0 (2 after it), rank 3 sends to 1
    assert per_node(FOUR_BY_ONE, Op.BROADCAST, src=2) == [0.0, 0.0, 2 * PAYLOAD, PAYLOAD]


def test_every_rank_meters_its_own_inter_node_bytes_and_its_groups_mean() -> None:
    meters = [CommMeter(TWO_BY_TWO, rank=rank) for rank in WORLD]
    for meter in meters:
        meter.record(Op.ALL_REDUCE, PAYLOAD, meter.world())
        meter.record(Op.ALL_REDUCE, PAYLOAD, meter.group("node", (0, 1) if meter.rank < 2 else (2, 3)))
    own = [m.total("inter_node_bytes") for m in meters]
    assert own == [1.5 * PAYLOAD, 0.0, 1.5 * PAYLOAD, 0.0]  # gloo's ring sends backwards: 0->3 and 2->1 leave
    # what rank 0 shows live is the run's mean per rank, as its summary will be
    assert [m.total(GROUP_MEAN_INTER) for m in meters] == [sum(own) / len(own)] * 4
    restored = CommMeter(TWO_BY_TWO, rank=0)
    restored.load_state_dict(meters[0].state_dict())  # a resumed run keeps both figures
    assert restored.rows() == meters[0].rows()


def test_gloo_s_all_reduce_ring_cuts_its_segments_as_gloo_does() -> None:
    # 1000 B over 4 ranks: segments = the least multiple of 4 >= max(1, 2 x 4) = 8, each 125 B rounded up to
    # whole float32s = 128 B, the last one 1000 - 7 x 128 = 104 B; reduce-scatter and all-gather each run
    # 8 - 8 / 4 = 6 iterations of one message per rank, to the previous rank
    sent = wire.messages("all_reduce", 4, PAYLOAD, 4)
    assert len(sent) == 2 * 6 * 4 and {(m.src, m.dst) for m in sent} == {(0, 3), (1, 0), (2, 1), (3, 2)}
    assert sorted({m.nbytes for m in sent}) == [104, 128]
    assert sum(m.nbytes for m in sent) == 2 * 3 * PAYLOAD and wire.rounds("all_reduce", 4, PAYLOAD) == 12
    # 3 MiB in float32 over 2 ranks: ceil(3 MiB / 1 MiB) = 3 segments, rounded up to a multiple of 2, at least 4
    assert wire.rounds("all_reduce", 2, 3 << 20, 4) == 2 * (4 - 2)
    assert [len(wire.messages("all_reduce", 2, 5 << 20, 4)), wire.messages("all_reduce", 1, 10)] == [2 * (6 - 3) * 2, ()]
    # 24 B of float64 over 4 ranks: 8 segments of 8 B, 5 of them empty and never sent
    assert sorted(m.nbytes for m in wire.messages("all_reduce", 4, 24, 8)) == [8] * 18


def test_gloo_s_all_gather_sends_halves_and_even_empty_ones() -> None:
    sent = wire.messages("all_gather", 4, 4 * 9)  # 9 B a rank: halves of 4 and 5 B, 2 x 3 rounds
    assert sorted({m.nbytes for m in sent}) == [4, 5] and len(sent) == 6 * 4
    assert {(m.src, m.dst) for m in sent} == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert [m.nbytes for m in wire.messages("all_gather", 2, 2)] == [0, 0, 1, 1]  # 1 B a rank: an empty half


def test_messages_and_framing_across_nodes_per_rank() -> None:
    # the 1000 B all-reduce in 2 x 2: ranks 0 and 2 send their 12 messages across, ranks 3 and 1 receive them;
    # each message: two 48 B preambles from the sender, one back from the receiver
    counts = [TWO_BY_TWO.inter_node_messages(rank, Op.ALL_REDUCE, PAYLOAD, WORLD) for rank in WORLD]
    assert counts == [(12, 12 * 96), (0, 12 * 48), (12, 12 * 96), (0, 12 * 48)]
    # a barrier: rounds at distance 1 and 2; in 2 x 2 the crossing messages are 1->2, 3->0 (d=1) and all four (d=2)
    barrier = [TWO_BY_TWO.inter_node_messages(rank, Op.BARRIER, 0, WORLD) for rank in WORLD]
    assert [sent for sent, _ in barrier] == [1, 2, 1, 2] and sum(f for _, f in barrier) == 6 * 144
    assert FOUR_BY_ONE.inter_node_messages(0, Op.BROADCAST, PAYLOAD, WORLD) == (2, 2 * 96)
    assert FOUR_BY_ONE.inter_node_messages(3, Op.BROADCAST, PAYLOAD, WORLD) == (0, 48)
    meter = CommMeter(TWO_BY_TWO, rank=0)
    meter.record(Op.ALL_REDUCE, PAYLOAD, meter.world())
    (row,) = meter.rows()
    assert (row["inter_node_messages"], row["inter_node_framing_bytes"]) == (12, 12 * 96)


def test_time_to_target_is_the_first_evaluation_at_or_above_it() -> None:
    history = [{"val_top1": 0.5, "train_seconds": 1.0}, {"val_top1": 0.9, "train_seconds": 2.0},
               {"val_top1": 0.95, "train_seconds": 3.0}]
    assert time_to_target(history, 0.9) == 2.0
    assert time_to_target(history, 0.99) is None and time_to_target(history, None) is None


def test_time_to_target_as_an_objective_needs_a_target(tmp_path: Path) -> None:
    study = write_study(tmp_path / "s.yaml", base=TINY_BASE, objectives=["top1", "time_to_target"], pruner={"name": "none"})
    with pytest.raises(ConfigError, match="time_to_target needs train.target_top1"):
        load_study_spec(study)
    with_target = write_study(tmp_path / "t.yaml", base={**TINY_BASE, "train": {**TINY_BASE["train"], "target_top1": 0.9}},
                              objectives=["top1", "time_to_target", "train_seconds"], pruner={"name": "none"})
    assert load_study_spec(with_target).directions == ["maximize", "minimize", "minimize"]
