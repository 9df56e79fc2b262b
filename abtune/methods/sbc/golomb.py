"""Golomb/Rice coding of sorted positions into a packed bit stream, vectorized with numpy.

Gap convention: for strictly increasing positions x_0 < x_1 < ..., the coded gaps are
g_0 = x_0 and g_i = x_i - x_{i-1} - 1, so every gap is >= 0 and a dense run codes as zeros.

Each gap g is split with Rice parameter b into a quotient q = g >> b and a remainder
r = g & (2**b - 1). The quotient is written in unary as q one-bits followed by a terminating
zero-bit; the remainder as b bits, most significant first.

Stream layout: all ``count`` unary quotients first (in order), then all ``count`` b-bit
remainders (in order), packed MSB-first into bytes with ``np.packbits``; the last byte is
padded with zero-bits. This has exactly the bit count of the interleaved layout
(sum of q + 1 + b per position) but lets both directions run without a per-position loop:
the decoder finds the unary terminators with one ``np.flatnonzero`` and then reads the
remainders as a fixed-width block.
"""

import math

import numpy as np

GOLDEN_RATIO = (1.0 + math.sqrt(5.0)) / 2.0
MAX_RICE_PARAMETER = 63
"""Gaps of int64 positions are < 2**63, so a larger b would only add zero-bits."""
MAX_STREAM_BITS = 2**32
"""Refuse streams above 512 MiB (4 GiB while unpacked); only a Rice parameter far too small for the gaps gets there."""
BITS_PER_BYTE = 8
_UINT_WIDTHS = (1, 2, 4, 8)


def optimal_rice_parameter(p: float) -> int:
    """b* = 1 + floor(log2(log(phi - 1) / log(1 - p))) for position density 0 < p < 1.

    The result is clamped to 0..MAX_RICE_PARAMETER; for p close to 1 the formula goes negative
    and b = 0 is optimal. p == 1 (every position present, all gaps zero) gives b = 0: one bit per
    position. Among all Rice parameters this minimizes ``expected_bits_per_position`` for
    geometrically distributed gaps.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"position density p must be in (0, 1], got {p}")
    if p == 1.0:
        return 0
    ratio = math.log(GOLDEN_RATIO - 1.0) / math.log1p(-p)  # infinite for subnormal p
    b = 1 + math.floor(math.log2(min(ratio, 2.0**MAX_RICE_PARAMETER)))
    return min(max(b, 0), MAX_RICE_PARAMETER)


def expected_bits_per_position(p: float) -> float:
    """b* + 1 / (1 - (1 - p) ** (2 ** b*)): mean code length of a geometric gap with parameter p."""
    b = optimal_rice_parameter(p)
    if p == 1.0:
        return float(b + 1)
    # 1 - (1 - p) ** 2**b, computed without cancellation for tiny p.
    stop_probability = -math.expm1(2.0**b * math.log1p(-p))
    return b + 1.0 / stop_probability


def encode_positions(positions: np.ndarray, b: int) -> bytes:
    """Rice-code strictly increasing non-negative positions with parameter b (see module docstring)."""
    _check_rice_parameter(b)
    gaps = _gaps(positions)
    quotients = gaps >> b
    total_bits = int(quotients.sum()) + gaps.size * (1 + b)
    if total_bits > MAX_STREAM_BITS:
        raise ValueError(f"Rice stream would need {total_bits} bits; b={b} is far too small for these gaps")
    unary = _unary_bits(quotients)
    remainders = _fixed_width_bits(gaps & ((1 << b) - 1), b)
    return np.packbits(np.concatenate((unary, remainders))).tobytes()


def decode_positions(data: bytes, count: int, b: int) -> np.ndarray:
    """Inverse of ``encode_positions``; ``data`` must be exactly the encoded stream (no trailing bytes)."""
    _check_rice_parameter(b)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    terminators = np.flatnonzero(bits == 0)[:count]
    if terminators.size < count:
        raise ValueError(f"truncated Rice stream: found {terminators.size} of {count} unary codes")
    quotients = np.diff(terminators, prepend=-1) - 1
    unary_end = int(terminators[-1]) + 1 if count else 0
    end = unary_end + count * b
    if end > bits.size:
        raise ValueError(f"truncated Rice stream: need {end} bits, have {bits.size}")
    expected_bytes = -(-end // BITS_PER_BYTE)
    if len(data) != expected_bytes:
        raise ValueError(f"Rice stream has {len(data)} bytes, expected {expected_bytes}")
    remainders = _read_fixed_width(bits[unary_end:end], count, b)
    gaps = (quotients.astype(np.int64) << b) | remainders
    return np.cumsum(gaps + 1) - 1


def _check_rice_parameter(b: int) -> None:
    if not 0 <= b <= MAX_RICE_PARAMETER:
        raise ValueError(f"Rice parameter b must be in 0..{MAX_RICE_PARAMETER}, got {b}")


def _gaps(positions: np.ndarray) -> np.ndarray:
    positions = np.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"positions must be 1-D, got shape {positions.shape}")
    if positions.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(positions.dtype, np.integer):
        raise ValueError(f"positions must be integers, got dtype {positions.dtype}")
    positions = positions.astype(np.int64, copy=False)
    gaps = np.diff(positions, prepend=-1) - 1
    if positions[0] < 0 or gaps.min() < 0:
        raise ValueError("positions must be non-negative and strictly increasing")
    return gaps


def _unary_bits(quotients: np.ndarray) -> np.ndarray:
    """q one-bits then a zero-bit per quotient, concatenated."""
    terminators = np.cumsum(quotients + 1) - 1
    bits = np.ones(int(terminators[-1]) + 1 if terminators.size else 0, dtype=np.uint8)
    bits[terminators] = 0
    return bits


def _uint_width(b: int) -> int:
    """Smallest unsigned integer width in bytes that holds b bits."""
    return next(w for w in _UINT_WIDTHS if w * BITS_PER_BYTE >= b)


def _fixed_width_bits(values: np.ndarray, b: int) -> np.ndarray:
    """The low b bits of each value, MSB first, concatenated."""
    if b == 0:
        return np.zeros(0, dtype=np.uint8)
    width = _uint_width(b)
    big_endian = values.astype(f">u{width}").view(np.uint8).reshape(values.size, width)
    return np.unpackbits(big_endian, axis=1)[:, width * BITS_PER_BYTE - b :].ravel()


def _read_fixed_width(bits: np.ndarray, count: int, b: int) -> np.ndarray:
    """Inverse of ``_fixed_width_bits``: count b-bit MSB-first integers as int64."""
    if b == 0:
        return np.zeros(count, dtype=np.int64)
    width = _uint_width(b)
    padded = np.zeros((count, width * BITS_PER_BYTE), dtype=np.uint8)
    padded[:, width * BITS_PER_BYTE - b :] = bits.reshape(count, b)
    return np.packbits(padded, axis=1).view(f">u{width}").ravel().astype(np.int64)
