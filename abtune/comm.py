"""The traffic meter: every collective abtune issues goes through here and is counted.

Counts are per rank (what this process sends), keyed by phase, process group and collective.
Wire bytes use the standard ring-algorithm estimates: an all-reduce moves 2(n-1)/n times its
payload per rank; a broadcast or all-gather moves (n-1)/n times the gathered/broadcast size.
A group is "inter" (its locality) when it spans more than one node.

Inter-node bytes are the bytes this rank sends to a rank on another node, from the algorithm gloo
(2.14) really runs, checked against a shaped link's kernel counters: all-reduce and all-gather are
rings over the group's ranks in order (all-reduce: each rank sends its wire bytes to the previous one;
all-gather: to the next one), a broadcast is
a binomial tree (in round d = 1, 2, 4, ..., a rank d or more positions past the root, counting from
the root, receives the whole payload from the rank d positions before it). Summed over ranks they
are the bytes that cross node boundaries.

Beside the bytes, each tally counts the messages this rank sends to other nodes and the framing gloo
puts around every message it sends or receives across (`inter_node_framing_bytes`: 48-byte preambles,
`abtune.wire`), from the message schedule of each algorithm. Bytes stay the algorithm's payload, what any
backend must move; payload plus framing is what gloo's TCP streams carry, headers of packets aside.

Only some ranks of a ring send across (in 2 nodes x 2 ranks, ranks 0 and 2 in an all-reduce), so one rank's own figure
says little about the run. Each tally therefore also keeps the group's mean per rank
(`group_mean_inter_node_bytes`), which every rank can compute from the placement alone: rank 0's
live evaluation rows show that. It is the run's mean per rank when every group rank 0 is not in
is laid out like one of its own (AB's groups are); the summary's figures are the exact means over
every rank's own counts.

The meter also refuses a tensor that is not on the run's device, naming the collective, the group
and both devices: NCCL has no CPU backend, so a CPU tensor handed to a collective kills a GPU run.
In strict-device mode (`abtune.strict_device`) tensors a GPU run would hold on the CPU are refused
too, so a CPU run finds the mistake.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist

from abtune import strict_device, wire
from abtune.errors import TrainingFailed
from abtune.phases import Phase

# torch 2.13 renamed all_gather_into_tensor to all_gather_single (2.14 warns on the old name); 2.12 and older,
# such as the torch 2.11 of the GPU images this project was checked on, have only the old name.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Op(StrEnum):
    ALL_REDUCE = "all_reduce"
    BROADCAST = "broadcast"
    ALL_GATHER = "all_gather"
    BARRIER = "barrier"


def broadcast_children(position: int, group_size: int) -> list[int]:
    """Positions (counted from the root) the rank at `position` sends the payload to in gloo's binomial tree."""
    children, distance = [], 1
    while distance < group_size:
        if position < distance and position + distance < group_size:
            children.append(position + distance)
        distance *= 2
    return children


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

    def inter_node_bytes(self, rank: int, op: Op, payload_bytes: int, ranks: tuple[int, ...], src: int = 0) -> float:
        """Bytes `rank` sends to other nodes in this collective over the group `ranks` (see the module's
        docstring; `src` is the broadcast root's position in the group)."""
        size = len(ranks)
        if size <= 1 or op is Op.BARRIER or rank not in ranks:
            return 0.0
        me = ranks.index(rank)
        node = self.node_of_rank[rank]
        if op is Op.BROADCAST:
            children = broadcast_children((me - src) % size, size)
            return float(payload_bytes * sum(self.node_of_rank[ranks[(c + src) % size]] != node for c in children))
        # gloo's all-reduce ring sends to the previous rank, its all-gather ring to the next one
        peer = ranks[(me - 1) % size] if op is Op.ALL_REDUCE else ranks[(me + 1) % size]
        return payload_bytes * wire_factor(op, size) if self.node_of_rank[peer] != node else 0.0

    def inter_node_messages(self, rank: int, op: Op, payload_bytes: int, ranks: tuple[int, ...], src: int = 0,
                            element_size: int = 4) -> tuple[int, int]:
        """Messages `rank` sends to other nodes in this collective, and the framing bytes it sends to other
        nodes (for those, and for the messages it receives from other nodes): gloo's schedule (`abtune.wire`)."""
        if rank not in ranks:
            return 0, 0
        me, node = ranks.index(rank), self.node_of_rank[rank]
        sent = received = 0
        for message in wire.messages(op.value, len(ranks), payload_bytes, element_size, src):
            if message.src == me and self.node_of_rank[ranks[message.dst]] != node:
                sent += 1
            elif message.dst == me and self.node_of_rank[ranks[message.src]] != node:
                received += 1
        return sent, wire.framing_bytes(sent, received)


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
    inter_node_bytes: float = 0.0
    group_mean_inter_node_bytes: float = 0.0
    inter_node_messages: int = 0
    inter_node_framing_bytes: int = 0

    def add(self, payload: int, wire: float, inter_node: float, group_mean_inter_node: float,
            messages: int = 0, framing: int = 0) -> None:
        self.calls += 1
        self.payload_bytes += payload
        self.wire_bytes += wire
        self.inter_node_bytes += inter_node
        self.group_mean_inter_node_bytes += group_mean_inter_node
        self.inter_node_messages += messages
        self.inter_node_framing_bytes += framing


class CommMeter:
    """Counts bytes by (phase, group, op) and issues the metered collectives."""

    def __init__(self, topology: Topology, device: torch.device | None = None, rank: int = 0) -> None:
        self.topology = topology
        self.device = device if device is not None else torch.device("cpu")
        self.rank = rank
        self.phase = Phase.SETUP
        self._tallies: dict[tuple[str, str, str, str], Tally] = defaultdict(Tally)
        # What a hung rank waits in (read by abtune/training/hang.py from its own thread): the blocking
        # collective under way, else the last one issued (DDP's gradient buckets are asynchronous).
        self.waiting_in: str | None = None
        self.last_issued: str | None = None

    @property
    def phase(self) -> str:
        """What the next collectives count as (a Phase's name)."""
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self._phase = str(phase)  # a plain str: the counts go into checkpoints, pickled, and summaries

    def group(self, name: str, ranks: tuple[int, ...], handle: Any = None) -> CommGroup:
        return CommGroup(name, ranks, self.topology.spans_nodes(ranks), handle)

    def world(self) -> CommGroup:
        return self.group("world", tuple(range(self.topology.world_size)))

    def record(self, op: Op, payload_bytes: int, group: CommGroup, src: int | None = None,
               element_size: int = 4) -> None:
        """Count one collective; `src`: a broadcast's root, as a global rank (default: the group's first);
        `element_size`: bytes per element (gloo's all-reduce cuts its segments at whole elements)."""
        wire_bytes = payload_bytes * wire_factor(op, group.size)
        root = group.ranks.index(src) if src is not None else 0
        inter = self.topology.inter_node_bytes(self.rank, op, payload_bytes, group.ranks, root)
        group_mean = sum(self.topology.inter_node_bytes(r, op, payload_bytes, group.ranks, root)
                         for r in group.ranks) / group.size
        messages, framing = self.topology.inter_node_messages(self.rank, op, payload_bytes, group.ranks, root,
                                                              element_size)
        self._tallies[(self.phase, group.name, group.locality, op.value)].add(
            payload_bytes, wire_bytes, inter, group_mean, messages, framing)
        self.last_issued = f"{op.value} over group '{group.name}' of {group.size} ranks in phase {self.phase}"

    def check_device(self, what: str, group: CommGroup, *tensors: torch.Tensor) -> None:
        """Refuse tensors that are not on the run's device (see the module's docstring)."""
        for tensor in tensors:
            check_device(tensor, self.device, f"{what} over group '{group.name}'")

    # --- metered collectives -------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, group: CommGroup, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> None:
        self.check_device(Op.ALL_REDUCE, group, tensor)
        self.record(Op.ALL_REDUCE, tensor.nbytes, group, element_size=tensor.element_size())
        with self._waiting():
            dist.all_reduce(tensor, op=op, group=group.handle)

    def broadcast(self, tensor: torch.Tensor, src: int, group: CommGroup) -> None:
        self.check_device(Op.BROADCAST, group, tensor)
        self.record(Op.BROADCAST, tensor.nbytes, group, src)
        with self._waiting():
            dist.broadcast(tensor, src=src, group=group.handle)

    def all_gather(self, output: torch.Tensor, tensor: torch.Tensor, group: CommGroup) -> None:
        self.check_device(Op.ALL_GATHER, group, output, tensor)
        self.record(Op.ALL_GATHER, output.nbytes, group)
        with self._waiting():
            all_gather_single(output, tensor, group=group.handle)

    def barrier(self, group: CommGroup) -> None:
        self.record(Op.BARRIER, 0, group)
        with self._waiting():
            dist.barrier(group=group.handle)

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        self.waiting_in = self.last_issued
        try:
            yield
        finally:
            self.waiting_in = None

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
            self._tallies[key] = Tally(row["calls"], row["payload_bytes"], row["wire_bytes"],
                                       row.get("inter_node_bytes", 0.0),
                                       row.get("group_mean_inter_node_bytes", 0.0),
                                       row.get("inter_node_messages", 0), row.get("inter_node_framing_bytes", 0))


def check_device(tensor: torch.Tensor, device: torch.device, what: str) -> None:
    """Raise TrainingFailed when `tensor` is not on `device` or, in strict-device mode, would sit on a
    GPU run's CPU."""
    if tensor.device != device:
        where = f"is on {tensor.device}"
    elif strict_device.is_foreign(tensor):
        where = "would be on the CPU of a GPU run (strict-device mode: it was made without device=)"
    else:
        return
    raise TrainingFailed(
        f"{what}: a {tuple(tensor.shape)} {tensor.dtype} tensor {where}, but the run's device is {device}; "
        "create it with device= the run's device (NCCL has no CPU backend)"
    )


GROUP_MEAN_INTER = "group_mean_inter_node_bytes"


def sum_rows(rows: list[dict[str, Any]], key: str = "wire_bytes", **match: str) -> float:
    """Sum of `key` over the matching rows; a row from before `key` existed (messages, framing) counts 0."""
    return sum(row.get(key, 0) for row in rows if all(row[field] == value for field, value in match.items()))


def _coalesced_(meter: CommMeter, tensors: list[torch.Tensor], group: CommGroup, op: Op,
                collective: Callable[[torch.Tensor], None]) -> None:
    """Run `collective` on one flat buffer per dtype and copy the result back into `tensors`."""
    meter.check_device(op, group, *tensors)  # flattening would hide a tensor on the wrong device
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
    _coalesced_(meter, tensors, group, Op.BROADCAST, lambda flat: meter.broadcast(flat, src, group))


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

    _coalesced_(meter, [t for t in tensors if t.is_floating_point()], group, Op.ALL_REDUCE, reduce)


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
