"""The Sparse Binary Compression message for one tensor, and its byte encoding.

A message is a record that can be concatenated with others (one per tensor of a model):

    tag      uint8    bit 7: KIND_DENSE (1) or KIND_BINARY (0); bits 0-5: Rice parameter b
    numel    varint   number of entries of the flattened tensor
    count    varint   number of transmitted positions
    stream   varint   length in bytes of the Golomb position stream
    value    float32  signed mean of the kept entries (KIND_BINARY only)
    values   float32 x count, in position order (KIND_DENSE only)
    positions         the Golomb/Rice stream (see ``golomb``)

Varints are unsigned LEB128 (7 bits per byte), so the header of a typical weight costs 8 to 14
bytes instead of fixed 64-bit fields: with 1% of positions per tensor, headers would otherwise
rival the positions themselves on small layers. b is sent although it follows from count/numel,
so a decoder never depends on the encoder's floating-point rounding.

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

KIND_BINARY = 0
KIND_DENSE = 1
KIND_BIT = 0x80
RICE_MASK = 0x3F
VARINT_PAYLOAD_BITS = 7
VARINT_MORE = 0x80
TAG_BYTES = 1
VALUE_BYTES = 4
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
    """The record for one message (see the module docstring)."""
    count = len(msg.positions)
    if count and msg.positions[-1] >= msg.numel:
        raise ValueError(f"position {msg.positions[-1]} is outside a tensor of {msg.numel} entries")
    b = rice_parameter(msg.numel, count)
    stream = encode_positions(msg.positions, b)
    if isinstance(msg, SparseBinary):
        kind, values = KIND_BINARY, struct.pack("<f", msg.value)
    else:
        if len(msg.values) != count:
            raise ValueError(f"{len(msg.values)} values for {count} positions")
        kind, values = KIND_DENSE, np.asarray(msg.values, dtype=VALUE_DTYPE).tobytes()
    tag = bytes([(KIND_BIT if kind == KIND_DENSE else 0) | b])
    return tag + _varint(msg.numel) + _varint(count) + _varint(len(stream)) + values + stream


def decode(data: bytes) -> Message:
    """Inverse of ``encode`` for exactly one record."""
    msg, end = decode_from(data, 0)
    if end != len(data):
        raise ValueError(f"SBC message has {len(data) - end} bytes after its end")
    return msg


def decode_from(data: bytes, offset: int) -> tuple[Message, int]:
    """The record starting at ``offset`` of a concatenation, and the offset just after it."""
    if offset >= len(data):
        raise ValueError(f"SBC message expected at byte {offset} of {len(data)}")
    tag = data[offset]
    b, kind = tag & RICE_MASK, KIND_DENSE if tag & KIND_BIT else KIND_BINARY
    numel, offset = _read_varint(data, offset + TAG_BYTES)
    count, offset = _read_varint(data, offset)
    stream_bytes, offset = _read_varint(data, offset)
    if count > numel:
        raise ValueError(f"SBC message claims {count} positions in a tensor of {numel} entries")
    values_bytes = VALUE_BYTES if kind == KIND_BINARY else count * VALUE_BYTES
    end = offset + values_bytes + stream_bytes
    if end > len(data):
        raise ValueError(f"truncated SBC message: needs {end} bytes, have {len(data)}")
    body = bytes(data[offset + values_bytes : end])
    positions = _decode_checked(body, numel, count, b)
    if kind == KIND_BINARY:
        (value,) = struct.unpack_from("<f", data, offset)
        return SparseBinary(numel=numel, positions=positions, value=value), end
    values = np.frombuffer(data, dtype=VALUE_DTYPE, count=count, offset=offset).astype(np.float32)
    return SparseDense(numel=numel, positions=positions, values=values), end


def header_bytes(numel: int, count: int, stream_bytes: int, *, binarized: bool = True) -> int:
    """Bytes of a record besides its position stream (and besides its values when not binarized)."""
    fixed = TAG_BYTES + (VALUE_BYTES if binarized else 0)
    return fixed + len(_varint(numel)) + len(_varint(count)) + len(_varint(stream_bytes))


def rice_parameter(numel: int, count: int) -> int:
    """The Rice parameter ``encode`` uses: optimal for density count / numel, 0 for an empty message."""
    return optimal_rice_parameter(count / numel) if count else 0


def encoded_bits_closed_form(numel: int, count: int, *, binarized: bool = True) -> float:
    """Header + count * expected_bits_per_position(count / numel) (+ 32 bits per value if not binarized).

    The real message is within byte padding of this when positions are uniformly random.
    """
    stream_bits = count * expected_bits_per_position(count / numel) if count else 0.0
    stream_bytes = math.ceil(stream_bits / BITS_PER_BYTE)
    bits = float(header_bytes(numel, count, stream_bytes, binarized=binarized) * BITS_PER_BYTE) + stream_bits
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


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> VARINT_PAYLOAD_BITS
        out.append(low | (VARINT_MORE if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while offset < len(data):
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & VARINT_MORE:
            return value, offset
        shift += VARINT_PAYLOAD_BITS
    raise ValueError("truncated SBC message: a length field runs past the end")


def _decode_checked(data: bytes, numel: int, count: int, b: int) -> np.ndarray:
    positions = decode_positions(data, count, b)
    if count and (positions[0] < 0 or positions[-1] >= numel):
        raise ValueError(f"SBC message has positions outside 0..{numel - 1}")
    return positions
