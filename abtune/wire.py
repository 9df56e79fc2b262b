"""What gloo sends for each collective: its messages, their sizes, and the framing around them.

torch's CPU backend (ProcessGroupGloo, torch 2.14) runs gloo's unbound-buffer algorithms with their
default options; read from gloo's sources (facebookincubator/gloo, 2025):

- all-reduce (`gloo/allreduce.cc`, ring): the buffer is cut into `segments` = the least multiple of the
  group size that is at least max(ceil(bytes / 1 MiB), 2 x size); each segment is rounded up to whole
  elements. A reduce-scatter, then an all-gather, each of `segments - segments / size` iterations; in
  each, the rank at position p sends one segment to position p - 1 (when the segment holds any byte).
- all-gather (`gloo/allgather.cc`, ring): each rank's block is cut in two halves (floor and rest), and
  2 (size - 1) times a rank sends one half to position p + 1 (even an empty half is a message).
- broadcast (`gloo/broadcast.cc`, binomial tree): the whole buffer in one message per child, children
  as `abtune.comm.broadcast_children` says.
- barrier (`gloo/barrier.cc`, dissemination): ceil(log2 size) rounds; in round d = 1, 2, 4, ... each
  rank sends an empty message to position p + d.

Framing (`gloo/transport/tcp/pair.cc`): every message costs three 48-byte preambles (six size_t): the
sender's NOTIFY_SEND_READY and SEND_UNBOUND_BUFFER (which carries the data), and the receiver's
NOTIFY_RECV_READY back to the sender. Below gloo, TCP cuts the stream into packets with their own
headers; that is the link's business (`abtune.timing` counts them from a cluster's packet size).

Torch-free: the time model reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

PREAMBLE_BYTES = 48
SENDER_PREAMBLES = 2  # NOTIFY_SEND_READY, then SEND_UNBOUND_BUFFER with the data
RECEIVER_PREAMBLES = 1  # NOTIFY_RECV_READY, back to the sender
MAX_SEGMENT_BYTES = 1 << 20  # gloo::AllreduceOptions::kMaxSegmentSize

ALL_REDUCE, BROADCAST, ALL_GATHER, BARRIER = "all_reduce", "broadcast", "all_gather", "barrier"


@dataclass(frozen=True)
class Message:
    """One gloo message between two positions of a group (positions: indices into the group's ranks)."""

    src: int
    dst: int
    nbytes: int
    round: int  # the algorithm's step it belongs to: messages of one round travel at the same time


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def ring_all_reduce(size: int, nbytes: int, element_size: int) -> list[Message]:
    elements_per_segment = max(1, MAX_SEGMENT_BYTES // element_size)
    segments = _round_up(max(-(-nbytes // (elements_per_segment * element_size)), 2 * size), size)
    per_rank = segments // size
    segment_bytes = _round_up(-(-nbytes // segments), element_size)
    iterations = segments - per_rank
    messages = []
    for stage, first in ((0, 1), (1, 0)):  # reduce-scatter sends from (p+1)·per_rank on, all-gather from p·per_rank
        for i in range(iterations):
            for p in range(size):
                offset = (((p + first) * per_rank + i) * segment_bytes) % (segments * segment_bytes)
                length = min(segment_bytes, nbytes - offset)
                if length > 0:
                    messages.append(Message(p, (p - 1) % size, length, stage * iterations + i))
    return messages


def ring_all_gather(size: int, nbytes: int) -> list[Message]:
    """`nbytes`: the gathered output (every rank's block)."""
    block = nbytes // size
    halves = (block // 2, block - block // 2)
    return [Message(p, (p + 1) % size, halves[i & 1], i // 2) for i in range(2 * (size - 1)) for p in range(size)]


def binomial_broadcast(size: int, nbytes: int, root: int) -> list[Message]:
    messages, distance, step = [], 1, 0
    while distance < size:
        for position in range(distance):  # counted from the root
            if position + distance < size:
                messages.append(Message((position + root) % size, (position + distance + root) % size, nbytes, step))
        distance, step = distance * 2, step + 1
    return messages


def dissemination_barrier(size: int) -> list[Message]:
    messages, distance, step = [], 1, 0
    while distance < size:
        messages += [Message(p, (p + distance) % size, 0, step) for p in range(size)]
        distance, step = distance * 2, step + 1
    return messages


@lru_cache(maxsize=4096)
def messages(op: str, size: int, nbytes: int, element_size: int = 4, root: int = 0) -> tuple[Message, ...]:
    """Every message of one collective over a group of `size` ranks; `nbytes`: the payload (all-gather:
    the gathered output), `root`: a broadcast's root position."""
    if size <= 1:
        return ()
    if op == ALL_REDUCE:
        return tuple(ring_all_reduce(size, nbytes, element_size)) if nbytes else ()
    if op == ALL_GATHER:
        return tuple(ring_all_gather(size, nbytes))
    if op == BROADCAST:
        return tuple(binomial_broadcast(size, nbytes, root))
    if op == BARRIER:
        return tuple(dissemination_barrier(size))
    raise ValueError(f"unknown collective {op!r}")


def rounds(op: str, size: int, nbytes: int, element_size: int = 4, root: int = 0) -> int:
    """Steps of the algorithm one after the other (what latency multiplies)."""
    sent = messages(op, size, nbytes, element_size, root)
    return 1 + max(m.round for m in sent) if sent else 0


def framing_bytes(sent: int, received: int) -> int:
    """Preamble bytes a rank sends for `sent` messages it sends and `received` messages it receives."""
    return PREAMBLE_BYTES * (SENDER_PREAMBLES * sent + RECEIVER_PREAMBLES * received)
