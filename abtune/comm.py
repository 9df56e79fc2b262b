"""The traffic meter: every collective abtune issues goes through here and is counted.

Counts are per rank (what this process sends), keyed by phase, process group and collective.
Wire bytes use the standard ring-algorithm estimates: an all-reduce moves 2(n-1)/n times its
payload per rank; a broadcast or all-gather moves (n-1)/n times the gathered/broadcast size.
A collective is inter-node when its group spans more than one node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist

TRAINING_PHASES = ("train", "warmup", "ab", "sync", "rebound")
"""Phases whose collectives are training itself (gradients, updates, AB's factors and sync): the
traffic studies optimize and DDP's training reference is set against. The other phases (setup,
eval, checkpoint, control, report) are counted apart."""


class Op(StrEnum):
    ALL_REDUCE = "all_reduce"
    BROADCAST = "broadcast"
    ALL_GATHER = "all_gather"
    BARRIER = "barrier"


def wire_factor(op: Op, group_size: int) -> float:
    """Bytes each rank sends per payload byte under ring algorithms."""
    if group_size <= 1 or op is Op.BARRIER:
        return 0.0
    if op is Op.ALL_REDUCE:
        return 2.0 * (group_size - 1) / group_size
    return (group_size - 1) / group_size


@dataclass(frozen=True)
class Topology:
    """Which node each rank runs on."""

    node_of_rank: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return len(self.node_of_rank)

    @property
    def num_nodes(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.num_nodes

    def spans_nodes(self, ranks: tuple[int, ...]) -> bool:
        return len({self.node_of_rank[r] for r in ranks}) > 1


@dataclass(frozen=True)
class CommGroup:
    """A process group with what the meter needs to know about it."""

    name: str
    ranks: tuple[int, ...]
    inter_node: bool
    handle: Any = field(default=None, compare=False, repr=False)  # None: the default (world) group

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def locality(self) -> str:
        return "inter" if self.inter_node else "intra"


@dataclass
class Tally:
    calls: int = 0
    payload_bytes: int = 0
    wire_bytes: float = 0.0

    def add(self, payload: int, wire: float) -> None:
        self.calls += 1
        self.payload_bytes += payload
        self.wire_bytes += wire


class CommMeter:
    """Counts bytes by (phase, group, op) and issues the metered collectives."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.phase = "setup"
        self._tallies: dict[tuple[str, str, str, str], Tally] = defaultdict(Tally)

    def group(self, name: str, ranks: tuple[int, ...], handle: Any = None) -> CommGroup:
        return CommGroup(name, ranks, self.topology.spans_nodes(ranks), handle)

    def world(self) -> CommGroup:
        return self.group("world", tuple(range(self.topology.world_size)))

    def record(self, op: Op, payload_bytes: int, group: CommGroup) -> None:
        wire = payload_bytes * wire_factor(op, group.size)
        self._tallies[(self.phase, group.name, group.locality, op.value)].add(payload_bytes, wire)

    # --- metered collectives -------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, group: CommGroup, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> None:
        self.record(Op.ALL_REDUCE, tensor.nbytes, group)
        dist.all_reduce(tensor, op=op, group=group.handle)

    def broadcast(self, tensor: torch.Tensor, src: int, group: CommGroup) -> None:
        self.record(Op.BROADCAST, tensor.nbytes, group)
        dist.broadcast(tensor, src=src, group=group.handle)

    def all_gather(self, output: torch.Tensor, tensor: torch.Tensor, group: CommGroup) -> None:
        self.record(Op.ALL_GATHER, output.nbytes, group)
        dist.all_gather_single(output, tensor, group=group.handle)

    def barrier(self, group: CommGroup) -> None:
        self.record(Op.BARRIER, 0, group)
        dist.barrier(group=group.handle)

    # --- reading --------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        return [
            {"phase": p, "group": g, "locality": loc, "op": op, **asdict(t)}
            for (p, g, loc, op), t in sorted(self._tallies.items())
        ]

    def total(self, key: str = "wire_bytes", **match: str) -> float:
        """Sum of `key` over the rows whose fields equal `match` (e.g. locality="inter")."""
        return sum_rows(self.rows(), key, **match)

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "rows": self.rows()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = state["phase"]
        self._tallies.clear()
        for row in state["rows"]:
            key = (row["phase"], row["group"], row["locality"], row["op"])
            self._tallies[key] = Tally(row["calls"], row["payload_bytes"], row["wire_bytes"])


def sum_rows(rows: list[dict[str, Any]], key: str = "wire_bytes", **match: str) -> float:
    return sum(row[key] for row in rows if all(row[field] == value for field, value in match.items()))


def _coalesced_(tensors: list[torch.Tensor], collective: Callable[[torch.Tensor], None]) -> None:
    """Run `collective` on one flat buffer per dtype and copy the result back into `tensors`."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        by_dtype[tensor.dtype].append(tensor)
    for same_dtype in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors([t.detach() for t in same_dtype])
        collective(flat)
        for tensor, result in zip(same_dtype, torch._utils._unflatten_dense_tensors(flat, same_dtype), strict=True):
            tensor.detach().copy_(result)


def broadcast_tensors_(meter: CommMeter, tensors: list[torch.Tensor], src: int, group: CommGroup) -> None:
    """Overwrite `tensors` with `src`'s values, one coalesced broadcast per dtype."""
    _coalesced_(tensors, lambda flat: meter.broadcast(flat, src, group))


def average_tensors_(
    meter: CommMeter, tensors: list[torch.Tensor], group: CommGroup, divide_by: float | None = None
) -> None:
    """Replace floating-point `tensors` by their sum over `group` divided by `divide_by` (default:
    the group size, i.e. the mean); one coalesced all-reduce per dtype.

    Sum-then-divide gives bit-identical results on every rank of the group.
    """
    divisor = group.size if divide_by is None else divide_by

    def reduce(flat: torch.Tensor) -> None:
        meter.all_reduce(flat, group)
        flat /= divisor

    _coalesced_([t for t in tensors if t.is_floating_point()], reduce)


def all_gather_bytes(meter: CommMeter, data: bytes, group: CommGroup, device: torch.device) -> list[bytes]:
    """Every rank's `data` (lengths may differ), in rank order of `group`.

    Two metered all-gathers: the lengths (int64 each), then the messages padded to the longest;
    the padding really crosses the wire with gloo and NCCL, so it is counted.
    """
    lengths = torch.empty(group.size, dtype=torch.int64, device=device)
    meter.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64, device=device), group)
    width = int(lengths.max())
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = torch.empty(width * group.size, dtype=torch.uint8, device=device)
    meter.all_gather(gathered, padded, group)
    rows = gathered.view(group.size, width).cpu().numpy()
    return [rows[r, : int(lengths[r])].tobytes() for r in range(group.size)]
