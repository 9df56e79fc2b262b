"""What the methods' saved bytes buy on a slow interconnect: ddp, ab, sbc and powersgd on the
emulated launcher at three link speeds, side by side in one invocation.

    sudo python benchmarks/bench_interconnect.py [--config studies/run_quickstart.yaml] [--steps 300]
        [--target 0.9] [--speeds unlimited,1gbit,100mbit]

Needs what the emulated launcher needs (root or CAP_NET_ADMIN, iproute2). Each row is one
`abtune train --launcher PROFILE` of 4 ranks as 2 simulated nodes: wall seconds (the whole command,
start-up included), training seconds, training seconds until the first evaluation at or above
--target, the bytes the links carried (all nodes, headers included), the model's inter-node bytes
(all ranks) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

METHODS = ("ddp", "ab", "sbc", "powersgd")
MEGA = 1e6


def profile(folder: Path, speed: str) -> Path:
    path = folder / f"link-{speed}.yaml"
    path.write_text(yaml.safe_dump({"kind": "local", "fabric": {"bandwidth": None if speed == "unlimited" else speed}}))
    return path


def run(config: Path, method: str, speed: str, args: argparse.Namespace, folder: Path) -> tuple[dict, float]:
    run_dir = folder / f"{speed}-{method}"
    command = [sys.executable, "-m", "abtune.cli", "train", str(config), "--launcher", str(profile(folder, speed)),
               "--nproc", "4", "--ranks-per-node", "2", "--run-dir", str(run_dir), "--no-tracking",
               "--set", f"method.name={method}", "--set", f"train.steps={args.steps}",
               "--set", f"train.target_top1={args.target}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return json.loads((run_dir / "summary.json").read_text()), time.perf_counter() - started


def row(speed: str, method: str, summary: dict, wall: float) -> str:
    timing, measured = summary["timing"], summary["traffic"]["measured_inter_node_bytes"]
    to_target = timing["time_to_target_seconds"]
    return (f"| {speed} | {method} | {wall:.1f} | {timing['train_seconds']:.1f} | "
            f"{'-' if to_target is None else f'{to_target:.1f}'} | {summary['final']['val_top1']:.4f} | "
            f"{measured['total'] / MEGA:.2f} | {measured['modelled'] / MEGA:.2f} | "
            f"{measured['payload'] / measured['modelled']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--speeds", default="unlimited,1gbit,100mbit")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"config {args.config}, {args.steps} steps, 4 ranks / 2 nodes on the emulated launcher, gloo")
    print("| link | method | wall s | train s | s to top-1 >= target | top-1 | link MB (measured) "
          "| inter-node MB (model) | payload / model |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for speed in args.speeds.split(","):
            for method in METHODS:
                print(row(speed, method, *run(args.config, method, speed, args, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
