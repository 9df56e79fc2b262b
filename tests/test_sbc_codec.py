"""Sparse Binary Compression core: Golomb/Rice position coding, binarization and the byte message."""

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from abtune.methods.sbc.compress import (
    KIND_BIT,
    SparseBinary,
    SparseDense,
    decode,
    decode_from,
    dense_from,
    encode,
    encoded_bits_closed_form,
    header_bytes,
    keep_count,
    rice_parameter,
    sparse_binarize,
    sparsify_dense,
)
from abtune.methods.sbc.golomb import (
    MAX_RICE_PARAMETER,
    decode_positions,
    encode_positions,
    expected_bits_per_position,
    optimal_rice_parameter,
)

MAX_TEST_RICE_PARAMETER = 20
UNARY_BITS_BUDGET_LOG2 = 16
"""Positions below 2**(b + this) keep the unary part of a test stream under ~2**16 bits."""
CLOSED_FORM_TOLERANCE = 0.02
LARGE_NUMEL = 10**6


@st.composite
def positions_and_rice_parameter(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Strictly increasing positions mixing scattered points, a dense run and huge gaps, plus b."""
    b = draw(st.integers(0, MAX_TEST_RICE_PARAMETER))
    limit = 2 ** (b + UNARY_BITS_BUDGET_LOG2)
    scattered = draw(st.lists(st.integers(0, limit - 1), max_size=50))
    run_start = draw(st.integers(0, limit - 1))
    run_length = draw(st.integers(0, 40))
    edges = draw(st.lists(st.sampled_from([0, 1, limit - 2, limit - 1]), max_size=4))
    run = range(run_start, min(run_start + run_length, limit))
    positions = np.array(sorted(set(scattered) | set(run) | set(edges)), dtype=np.int64)
    return positions, b


def bernoulli_positions(numel: int, p: float, seed: int) -> np.ndarray:
    return np.flatnonzero(np.random.default_rng(seed).random(numel) < p).astype(np.int64)


def uniform_positions(numel: int, count: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(numel, size=count, replace=False)).astype(np.int64)


def bits_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int32)


# --- Golomb/Rice -------------------------------------------------------------------------------------


@given(positions_and_rice_parameter())
@settings(max_examples=300, deadline=None)
def test_rice_round_trip_any_positions_any_b(case: tuple[np.ndarray, int]) -> None:
    positions, b = case
    data = encode_positions(positions, b)
    decoded = decode_positions(data, positions.size, b)
    assert decoded.dtype == np.int64
    np.testing.assert_array_equal(decoded, positions)


@given(
    p=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
    numel=st.integers(1, 5000),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=200, deadline=None)
def test_rice_round_trip_with_optimal_parameter(p: float, numel: int, seed: int) -> None:
    positions = bernoulli_positions(numel, p, seed)
    b = optimal_rice_parameter(p)
    np.testing.assert_array_equal(
        decode_positions(encode_positions(positions, b), positions.size, b), positions
    )


@pytest.mark.parametrize(
    ("positions", "b", "expected"),
    [
        ([], 3, b""),
        ([0], 0, bytes([0b0000_0000])),  # gap 0: unary "0"
        ([0, 1, 2], 0, bytes([0b0000_0000])),  # three gaps 0: "000"
        ([5], 0, bytes([0b1111_1000])),  # gap 5: "111110"
        ([5], 2, bytes([0b1001_0000])),  # gap 5 = 1*4 + 1: unary "10", remainder "01"
        ([1, 6], 2, bytes([0b0100_1000])),  # gaps 1, 4: unary "0" "10", remainders "01" "00"
    ],
)
def test_rice_bit_layout(positions: list[int], b: int, expected: bytes) -> None:
    assert encode_positions(np.array(positions, dtype=np.int64), b) == expected


def test_rice_extreme_positions_with_large_b() -> None:
    positions = np.array([0, 2**62, 2**63 - 1], dtype=np.int64)
    b = MAX_RICE_PARAMETER - 1
    np.testing.assert_array_equal(decode_positions(encode_positions(positions, b), 3, b), positions)


@pytest.mark.parametrize("bad", [[3, 3], [4, 2], [-1, 5], [[1, 2]], [0.5, 1.5]])
def test_rice_rejects_invalid_positions(bad: list) -> None:
    with pytest.raises(ValueError):
        encode_positions(np.array(bad), 2)


def test_rice_rejects_runaway_stream_and_bad_parameter() -> None:
    with pytest.raises(ValueError, match="too small"):
        encode_positions(np.array([2**40], dtype=np.int64), 0)
    with pytest.raises(ValueError):
        encode_positions(np.array([1], dtype=np.int64), MAX_RICE_PARAMETER + 1)


def test_rice_decode_rejects_truncated_or_padded_stream() -> None:
    positions = uniform_positions(10_000, 100, seed=1)
    data = encode_positions(positions, 6)
    with pytest.raises(ValueError, match="truncated"):
        decode_positions(data[: len(data) // 2], positions.size, 6)
    with pytest.raises(ValueError, match="bytes"):
        decode_positions(data + b"\x00", positions.size, 6)


@pytest.mark.parametrize(
    ("p", "b"), [(0.5, 0), (0.01, 6), (0.001, 9), (0.99, 0), (1.0, 0), (1e-300, 63), (5e-324, 63)]
)
def test_optimal_rice_parameter_values(p: float, b: int) -> None:
    assert optimal_rice_parameter(p) == b


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, math.nan])
def test_optimal_rice_parameter_rejects_invalid_density(p: float) -> None:
    with pytest.raises(ValueError):
        optimal_rice_parameter(p)


@given(st.floats(1e-12, 1.0, exclude_max=True))
def test_optimal_rice_parameter_minimizes_expected_bits(p: float) -> None:
    def bits(b: int) -> float:
        return b - 1.0 / math.expm1(2.0**b * math.log1p(-p))

    best = min(bits(b) for b in range(MAX_RICE_PARAMETER + 1))
    assert expected_bits_per_position(p) == pytest.approx(bits(optimal_rice_parameter(p)))
    assert expected_bits_per_position(p) <= best * (1 + 1e-12)


def test_expected_bits_per_position_at_full_density() -> None:
    assert expected_bits_per_position(1.0) == 1.0


# --- message size vs closed form ------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.01, 0.001])
def test_encoded_size_matches_closed_form(p: float) -> None:
    count = round(p * LARGE_NUMEL)
    positions = uniform_positions(LARGE_NUMEL, count, seed=7)
    msg = SparseBinary(numel=LARGE_NUMEL, positions=positions, value=0.5)
    actual_bits = len(encode(msg)) * 8
    assert actual_bits == pytest.approx(
        encoded_bits_closed_form(LARGE_NUMEL, count), rel=CLOSED_FORM_TOLERANCE
    )


def test_closed_form_of_empty_and_unbinarized_messages() -> None:
    # tag 1 + numel 1 + count 1 + stream length 1 + value 4 bytes
    assert encoded_bits_closed_form(100, 0) == 8 * 8 == len(encode(SparseBinary(100, np.zeros(0, np.int64), 0.0))) * 8
    # tag, numel, count, stream length (13 bytes: 1 each), then 100 values and 1 bit per position
    assert encoded_bits_closed_form(100, 100, binarized=False) == 4 * 8 + 100 * (1 + 32)


def test_varint_header_grows_with_numbers() -> None:
    assert header_bytes(100, 1, 1) == 8
    assert header_bytes(2**21, 2**14, 2**7) == 1 + 4 + 3 + 2 + 4


# --- sparse_binarize ----------------------------------------------------------------------------------


def test_sparse_binarize_hand_made_negative_side_wins() -> None:
    update = torch.tensor([0.5, -3.0, 1.0, 0.0, -1.0, 2.0, -0.25, 0.125])
    # k = 2: positives {2, 1} have mean 1.5, negatives {-3, -1} mean magnitude 2.
    msg = sparse_binarize(update, fraction=0.25)
    assert msg.numel == 8
    np.testing.assert_array_equal(msg.positions, [1, 4])
    assert msg.positions.dtype == np.int64
    assert msg.value == -2.0
    dense = dense_from(msg)
    assert dense.dtype == torch.float32
    torch.testing.assert_close(
        dense, torch.tensor([0.0, -2.0, 0.0, 0.0, -2.0, 0.0, 0.0, 0.0]), rtol=0, atol=0
    )
    residual = update - dense
    expected = torch.tensor([0.5, -1.0, 1.0, 0.0, 1.0, 2.0, -0.25, 0.125])
    torch.testing.assert_close(residual, expected, rtol=0, atol=0)


def test_sparse_binarize_hand_made_positive_side_wins() -> None:
    update = torch.tensor([[4.0, -1.0, 0.5], [-2.0, 3.0, 1.0]])
    # k = 2: positives {4, 3} have mean 3.5, negatives {-2, -1} mean magnitude 1.5.
    msg = sparse_binarize(update, fraction=2 / 6)
    np.testing.assert_array_equal(msg.positions, [0, 4])
    assert msg.value == 3.5
    residual = update - dense_from(msg).reshape(update.shape)
    torch.testing.assert_close(residual, torch.tensor([[0.5, -1.0, 0.5], [-2.0, -0.5, 1.0]]), rtol=0, atol=0)


def test_sparse_binarize_tie_keeps_positive_side() -> None:
    msg = sparse_binarize(torch.tensor([1.0, -1.0, 0.0, 0.0]), fraction=0.25)
    np.testing.assert_array_equal(msg.positions, [0])
    assert msg.value == 1.0


def test_sparse_binarize_fewer_positives_than_k() -> None:
    update = torch.tensor([5.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    msg = sparse_binarize(update, fraction=0.5)  # k = 3, but only one positive: mean 5 beats mean 1
    np.testing.assert_array_equal(msg.positions, [0])
    assert msg.value == 5.0


def test_sparse_binarize_only_positives() -> None:
    update = torch.tensor([0.0, 1.0, 2.0, 3.0])
    msg = sparse_binarize(update, fraction=0.5)
    np.testing.assert_array_equal(msg.positions, [2, 3])
    assert msg.value == 2.5


@pytest.mark.parametrize("update", [torch.zeros(10), torch.zeros(0), torch.zeros(3, 0)])
def test_sparse_binarize_without_non_zero_entries(update: torch.Tensor) -> None:
    msg = sparse_binarize(update, fraction=0.1)
    assert msg.numel == update.numel()
    assert msg.positions.size == 0
    assert msg.value == 0.0
    assert torch.equal(dense_from(msg), torch.zeros(update.numel()))
    decoded = decode(encode(msg))
    assert isinstance(decoded, SparseBinary)
    assert decoded.numel == update.numel() and decoded.positions.size == 0 and decoded.value == 0.0


def test_keep_count_rounds_up_without_float_noise() -> None:
    assert keep_count(100, 0.07) == 7
    assert keep_count(100, 0.071) == 8
    assert keep_count(10, 1e-9) == 1
    assert keep_count(10, 1.0) == 10
    with pytest.raises(ValueError):
        keep_count(10, 0.0)


@given(
    values=st.lists(
        st.sampled_from([-3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0]), min_size=1, max_size=60
    ),
    fraction=st.floats(0.01, 1.0),
)
@settings(max_examples=200, deadline=None)
def test_sparse_binarize_invariants(values: list[float], fraction: float) -> None:
    update = torch.tensor(values, dtype=torch.float32)
    k = keep_count(update.numel(), fraction)
    positives = np.sort(update[update > 0].double().numpy())[::-1][:k]
    negatives = np.sort(-update[update < 0].double().numpy())[::-1][:k]
    pos_mean = positives.mean() if positives.size else 0.0
    neg_mean = negatives.mean() if negatives.size else 0.0
    msg = sparse_binarize(update, fraction)
    if pos_mean == neg_mean == 0.0:
        assert msg.positions.size == 0
        return
    kept = update[torch.from_numpy(msg.positions)].numpy()
    side = positives if pos_mean >= neg_mean else negatives
    assert msg.positions.size == side.size == min(k, side.size)
    assert np.all(np.diff(msg.positions) > 0)
    np.testing.assert_array_equal(np.sort(np.abs(kept)), np.sort(side))  # the top k of that side
    assert msg.value == np.float32(math.copysign(side.mean(), kept[0]))
    residual = update - dense_from(msg)
    dropped = np.ones(update.numel(), dtype=bool)
    dropped[msg.positions] = False
    assert torch.equal(residual[torch.from_numpy(dropped)], update[torch.from_numpy(dropped)])
    assert torch.equal(residual[torch.from_numpy(msg.positions)], torch.from_numpy(kept) - msg.value)


def test_sparse_binarize_exactly_k_on_random_tensor() -> None:
    update = torch.randn(1000, 100, generator=torch.Generator().manual_seed(0))
    msg = sparse_binarize(update, fraction=0.01)
    assert msg.positions.size == 1000
    kept = update.reshape(-1)[torch.from_numpy(msg.positions)]
    assert torch.all(torch.sign(kept) == math.copysign(1.0, msg.value))
    assert msg.value == pytest.approx(kept.double().mean().item(), rel=1e-6)


# --- byte messages ------------------------------------------------------------------------------------


def test_binary_message_round_trip_and_header() -> None:
    update = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    msg = sparse_binarize(update, fraction=0.01)
    data = encode(msg)
    b = rice_parameter(10_000, 100)
    assert b == optimal_rice_parameter(0.01)
    assert data[0] == b  # binary kind: bit 7 clear
    assert data[1:4] == bytes([0x90, 0x4E, 100])  # numel 10000 as LEB128, count 100
    assert struct.unpack_from("<f", data, 1 + 2 + 1 + (1 if len(data) < 128 + 9 else 2))[0] == msg.value
    decoded = decode(data)
    assert isinstance(decoded, SparseBinary)
    assert decoded.numel == msg.numel and decoded.value == msg.value
    np.testing.assert_array_equal(decoded.positions, msg.positions)
    assert torch.equal(dense_from(decoded), dense_from(msg))


def test_dense_message_full_fraction_is_bit_exact() -> None:
    special = torch.tensor([-0.0, math.inf, -math.inf, math.nan, 1e-45, -3.4e38, 0.0])
    update = torch.cat([torch.randn(997, generator=torch.Generator().manual_seed(5)), special]).reshape(
        4, 251
    )
    msg = sparsify_dense(update, fraction=1.0)
    data = encode(msg)
    assert data[0] & KIND_BIT
    decoded = decode(data)
    assert isinstance(decoded, SparseDense)
    restored = dense_from(decoded).reshape(update.shape)
    assert torch.equal(bits_of(restored), bits_of(update))


def test_dense_message_partial_fraction_keeps_largest_values() -> None:
    update = torch.tensor([0.5, -3.0, 1.0, 0.0, -1.5, 2.0, -0.25, 0.125])
    msg = sparsify_dense(update, fraction=3 / 8)
    decoded = decode(encode(msg))
    assert isinstance(decoded, SparseDense)
    np.testing.assert_array_equal(decoded.positions, [1, 4, 5])
    np.testing.assert_array_equal(decoded.values, np.array([-3.0, -1.5, 2.0], dtype=np.float32))
    torch.testing.assert_close(
        update - dense_from(decoded),
        torch.tensor([0.5, 0.0, 1.0, 0.0, 0.0, 0.0, -0.25, 0.125]),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01" * 10,  # a valid record followed by a stray byte
        bytes([0x00, 0x80]),  # numel's varint runs past the end
        bytes([0x00, 4, 5, 1]) + b"\x00" * 4 + b"\x00",  # 5 positions in 4 entries
        bytes([0x00, 4, 1, 1]) + b"\x00" * 4 + bytes([0b1111_1000]),  # position 5 >= 4
        bytes([KIND_BIT, 4, 2, 1]) + b"\x00" * 4,  # 2 dense values need 8 bytes
    ],
)
def test_decode_rejects_malformed_messages(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


def test_encode_rejects_position_outside_tensor() -> None:
    with pytest.raises(ValueError):
        encode(SparseBinary(numel=4, positions=np.array([4], dtype=np.int64), value=1.0))


def test_concatenated_messages_decode_in_order() -> None:
    generator = torch.Generator().manual_seed(11)
    updates = [torch.randn(n, generator=generator) for n in (1, 7, 300, 5000)]
    messages = [sparse_binarize(u, 0.05) for u in updates[:2]] + [sparsify_dense(u, 0.1) for u in updates[2:]]
    blob = b"".join(encode(m) for m in messages)
    offset = 0
    for message in messages:
        decoded, offset = decode_from(blob, offset)
        assert torch.equal(dense_from(decoded), dense_from(message))
    assert offset == len(blob)
    with pytest.raises(ValueError, match="truncated"):
        decode_from(blob[:-1], len(blob) - len(encode(messages[-1])))
    with pytest.raises(ValueError, match="after its end"):
        decode(blob)
