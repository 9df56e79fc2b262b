"""The Sparse Binary Compression message for one tensor, and its byte encoding.

Wire format (all little-endian), ``HEADER_FORMAT = "<BBQQf"``, 22 bytes:

    kind   uint8    KIND_BINARY (1) or KIND_DENSE (2)
    b      uint8    Rice parameter of the position stream, optimal_rice_parameter(count / numel)
    numel  uint64   number of entries of the flattened tensor
    count  uint64   number of transmitted positions
    value  float32  signed mean of the kept entries (KIND_BINARY); 0.0 for KIND_DENSE

KIND_BINARY: header, then the Golomb position stream (see ``golomb``).
KIND_DENSE: header, then ``count`` float32 values in position order, then the Golomb position stream.

Messages carry float32: float16/bfloat16 updates survive exactly, float64 ones are rounded.
"""

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

from abtune.methods.sbc.golomb import (
    BITS_PER_BYTE,
    decode_positions,
    encode_positions,
    expected_bits_per_position,
    optimal_rice_parameter,
)

HEADER_FORMAT = "<BBQQf"
HEADER_BYTES = struct.calcsize(HEADER_FORMAT)
HEADER_BITS = HEADER_BYTES * BITS_PER_BYTE
KIND_BINARY = 1
KIND_DENSE = 2
VALUE_DTYPE = np.dtype("<f4")
VALUE_BITS = VALUE_DTYPE.itemsize * BITS_PER_BYTE
FRACTION_ROUNDING_SLACK = 1e-12
"""ceil(fraction * numel) is taken after shrinking by this relative amount, so 0.07 * 100 gives 7, not 8."""


@dataclass(frozen=True, eq=False)
class SparseBinary:
    """``value`` at every one of ``positions`` (sorted int64) of a flat tensor of ``numel`` entries."""

    numel: int
    positions: np.ndarray
    value: float


@dataclass(frozen=True, eq=False)
class SparseDense:
    """``values[i]`` at ``positions[i]`` (sorted int64) of a flat tensor of ``numel`` entries."""

    numel: int
    positions: np.ndarray
    values: np.ndarray


Message = SparseBinary | SparseDense


def keep_count(numel: int, fraction: float) -> int:
    """k = max(1, ceil(fraction * numel)), at most numel."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = math.ceil(fraction * numel * (1.0 - FRACTION_ROUNDING_SLACK))
    return min(max(1, k), numel)


def sparse_binarize(update: torch.Tensor, fraction: float) -> SparseBinary:
    """Keep the top-k positive or the top-k negative entries, whichever has the larger mean magnitude.

    k = keep_count(numel, fraction) is taken separately among the positive and among the negative
    entries (a side with fewer than k such entries keeps all of them). Every kept entry becomes the
    signed mean of its side; on a tie the positive side wins. Zeros are never kept; an update
    without non-zero entries gives an empty message with value 0.0.
    """
    flat = _flat_float32(update)
    k = keep_count(flat.numel(), fraction)
    if flat.numel() == 0:
        return SparseBinary(numel=0, positions=np.zeros(0, dtype=np.int64), value=0.0)
    pos_values, pos_indices = _top_side(flat, k, largest=True)
    neg_values, neg_indices = _top_side(flat, k, largest=False)
    pos_mean = _mean_magnitude(pos_values)
    neg_mean = _mean_magnitude(neg_values)
    if pos_mean == 0.0 and neg_mean == 0.0:
        return SparseBinary(numel=flat.numel(), positions=np.zeros(0, dtype=np.int64), value=0.0)
    if pos_mean >= neg_mean:
        indices, value = pos_indices, pos_mean
    else:
        indices, value = neg_indices, -neg_mean
    return SparseBinary(numel=flat.numel(), positions=_sorted_positions(indices), value=_to_float32(value))


def sparsify_dense(update: torch.Tensor, fraction: float) -> SparseDense:
    """Keep the top-k entries by magnitude with their values; fraction 1.0 keeps every entry exactly."""
    flat = _flat_float32(update)
    k = keep_count(flat.numel(), fraction)
    if k == flat.numel():
        positions = np.arange(flat.numel(), dtype=np.int64)
        return SparseDense(numel=flat.numel(), positions=positions, values=flat.cpu().numpy().copy())
    _, indices = torch.topk(flat.abs(), k, sorted=False)
    positions = _sorted_positions(indices)
    values = flat[torch.from_numpy(positions).to(flat.device)].cpu().numpy()
    return SparseDense(numel=flat.numel(), positions=positions, values=values)


def dense_from(msg: Message, device: torch.device | str | None = None) -> torch.Tensor:
    """The flat float32 tensor the message stands for."""
    out = torch.zeros(msg.numel, dtype=torch.float32, device=device)
    index = torch.from_numpy(msg.positions).to(out.device)
    if isinstance(msg, SparseBinary):
        out[index] = msg.value
    else:
        out[index] = torch.from_numpy(np.asarray(msg.values, dtype=np.float32)).to(out.device)
    return out


def encode(msg: Message) -> bytes:
    """Self-describing bytes: header, then (KIND_DENSE only) the values, then the position stream."""
    count = len(msg.positions)
    if count and msg.positions[-1] >= msg.numel:
        raise ValueError(f"position {msg.positions[-1]} is outside a tensor of {msg.numel} entries")
    b = rice_parameter(msg.numel, count)
    positions = encode_positions(msg.positions, b)
    if isinstance(msg, SparseBinary):
        header = struct.pack(HEADER_FORMAT, KIND_BINARY, b, msg.numel, count, msg.value)
        return header + positions
    if len(msg.values) != count:
        raise ValueError(f"{len(msg.values)} values for {count} positions")
    header = struct.pack(HEADER_FORMAT, KIND_DENSE, b, msg.numel, count, 0.0)
    return header + np.asarray(msg.values, dtype=VALUE_DTYPE).tobytes() + positions


def decode(data: bytes) -> Message:
    """Inverse of ``encode``."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"SBC message of {len(data)} bytes is shorter than its {HEADER_BYTES}-byte header")
    kind, b, numel, count, value = struct.unpack_from(HEADER_FORMAT, data)
    if count > numel:
        raise ValueError(f"SBC message claims {count} positions in a tensor of {numel} entries")
    body = memoryview(data)[HEADER_BYTES:]
    if kind == KIND_BINARY:
        positions = _decode_checked(bytes(body), numel, count, b)
        return SparseBinary(numel=numel, positions=positions, value=value)
    if kind == KIND_DENSE:
        values_bytes = count * VALUE_DTYPE.itemsize
        if len(body) < values_bytes:
            raise ValueError(f"SBC message too short for {count} float32 values")
        values = np.frombuffer(body[:values_bytes], dtype=VALUE_DTYPE).astype(np.float32)
        positions = _decode_checked(bytes(body[values_bytes:]), numel, count, b)
        return SparseDense(numel=numel, positions=positions, values=values)
    raise ValueError(f"unknown SBC message kind {kind}")


def rice_parameter(numel: int, count: int) -> int:
    """The Rice parameter ``encode`` uses: optimal for density count / numel, 0 for an empty message."""
    return optimal_rice_parameter(count / numel) if count else 0


def encoded_bits_closed_form(numel: int, count: int, *, binarized: bool = True) -> float:
    """Header + count * expected_bits_per_position(count / numel) (+ 32 bits per value if not binarized).

    The real message is within byte padding of this when positions are uniformly random.
    """
    bits = float(HEADER_BITS)
    if count:
        bits += count * expected_bits_per_position(count / numel)
    if not binarized:
        bits += count * VALUE_BITS
    return bits


def _flat_float32(update: torch.Tensor) -> torch.Tensor:
    return update.detach().reshape(-1).to(torch.float32)


def _top_side(flat: torch.Tensor, k: int, *, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of the (up to) k entries of largest magnitude among the positive (largest=True)
    or the negative (largest=False) entries."""
    values, indices = torch.topk(flat, k, largest=largest, sorted=False)
    on_side = values > 0 if largest else values < 0
    return values[on_side], indices[on_side]


def _mean_magnitude(values: torch.Tensor) -> float:
    return values.abs().to(torch.float64).mean().item() if values.numel() else 0.0


def _to_float32(value: float) -> float:
    return float(np.float32(value))


def _sorted_positions(indices: torch.Tensor) -> np.ndarray:
    return np.sort(indices.cpu().numpy().astype(np.int64, copy=False))


def _decode_checked(data: bytes, numel: int, count: int, b: int) -> np.ndarray:
    positions = decode_positions(data, count, b)
    if count and (positions[0] < 0 or positions[-1] >= numel):
        raise ValueError(f"SBC message has positions outside 0..{numel - 1}")
    return positions
