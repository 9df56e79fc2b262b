"""Throughput of SBC position coding, in MB/s of the dense fp32 tensor it stands for (numel * 4 bytes / s).

Columns:
  rice enc / rice dec   Golomb/Rice coding alone of count = p * numel uniformly random positions
  sbc enc               sparse_binarize + encode of a random normal tensor (top-k selection included)
  sbc dec               decode + dense_from back to a dense float32 tensor

Run: /work/venv/bin/python benchmarks/bench_golomb.py [--sizes 1000000 10000000] [--ps 0.01 0.001]
"""

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from abtune.methods.sbc.compress import decode, dense_from, encode, encoded_bits_closed_form, sparse_binarize
from abtune.methods.sbc.golomb import decode_positions, encode_positions, optimal_rice_parameter

DEFAULT_SIZES = (1_000_000, 10_000_000)
DEFAULT_PS = (0.01, 0.001)
DEFAULT_REPEATS = 7
BYTES_PER_FP32 = 4
MEGABYTE = 1e6
SEED = 0
COLUMNS = ("numel", "p", "count", "b", "bits/pos", "closed", "rice enc", "rice dec", "sbc enc", "sbc dec")


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(numel: int, seconds: float) -> float:
    return numel * BYTES_PER_FP32 / MEGABYTE / seconds


def measure(numel: int, p: float, repeats: int) -> tuple[str, ...]:
    rng = np.random.default_rng(SEED)
    count = max(1, round(p * numel))
    positions = np.sort(rng.choice(numel, size=count, replace=False)).astype(np.int64)
    b = optimal_rice_parameter(count / numel)
    stream = encode_positions(positions, b)
    assert np.array_equal(decode_positions(stream, count, b), positions)
    update = torch.randn(numel, generator=torch.Generator().manual_seed(SEED))
    message = encode(sparse_binarize(update, p))
    rice_enc = median_seconds(lambda: encode_positions(positions, b), repeats)
    rice_dec = median_seconds(lambda: decode_positions(stream, count, b), repeats)
    sbc_enc = median_seconds(lambda: encode(sparse_binarize(update, p)), repeats)
    sbc_dec = median_seconds(lambda: dense_from(decode(message)), repeats)
    closed_bits_per_pos = encoded_bits_closed_form(numel, count) / count
    return (
        f"{numel:,}",
        f"{p:g}",
        f"{count:,}",
        str(b),
        f"{len(stream) * 8 / count:.3f}",
        f"{closed_bits_per_pos:.3f}",
        *(f"{throughput(numel, s):,.0f}" for s in (rice_enc, rice_dec, sbc_enc, sbc_dec)),
    )


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    print("  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    parser.add_argument("--ps", type=float, nargs="+", default=DEFAULT_PS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    args = parser.parse_args()
    print(
        f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}"
    )
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}")
    print(f"median of {args.repeats} repeats; throughput columns in MB/s of dense fp32 input\n")
    print_table([measure(numel, p, args.repeats) for numel in args.sizes for p in args.ps])


if __name__ == "__main__":
    main()
