"""Step time and traffic of the training methods, side by side in one run.

    python benchmarks/bench_training.py [--config studies/run_quickstart.yaml] [--steps 300] [--nproc 4] [--ranks-per-node 2]

Runs `abtune train` once per variant on the same config, seed, data and ranks and prints one row
each: seconds per step (training steps only, including AB's decompositions and syncs), the ratio
to the zero-communication floor (DDP with a no-op comm hook), mean SVD time per decomposition,
and inter-node bytes per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = {
    "ddp (no-op hook: floor)": ["--set", "method.name=ddp", "--set", "method.comm_hook=noop"],
    "ddp": ["--set", "method.name=ddp"],
    "ab": ["--set", "method.name=ab"],
    "ab-nogroups": ["--set", "method.name=ab-nogroups"],
}


def run_variant(config: Path, extra: list[str], args: argparse.Namespace, folder: Path) -> dict:
    run_dir = folder / str(abs(hash(tuple(extra))))
    command = [sys.executable, "-m", "abtune.cli", "train", str(config), "--nproc", str(args.nproc),
               "--ranks-per-node", str(args.ranks_per_node), "--run-dir", str(run_dir),
               "--set", f"train.steps={args.steps}", "--set", f"train.eval_every={args.steps}", *extra]
    subprocess.run(command, check=True, capture_output=True)
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"config {args.config}, {args.steps} steps, {args.nproc} ranks / {args.nproc // args.ranks_per_node} nodes, gloo")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, extra in VARIANTS.items():
            rows.append((name, run_variant(args.config, extra, args, Path(folder))))
    floor = rows[0][1]["timing"]["seconds_per_step"]
    print("| variant | s/step | vs floor | SVD s/decomposition | training inter-node MB/rank | top-1 |")
    print("|---|---|---|---|---|---|")
    for name, summary in rows:
        step = summary["timing"]["seconds_per_step"]
        svd = summary.get("svd_seconds") or []
        svd_text = f"{sum(svd) / len(svd):.4f}" if svd else "-"
        inter = summary["traffic"]["training_inter_node_bytes"] / 1e6
        print(f"| {name} | {step:.4f} | {step / floor:.2f} | {svd_text} | {inter:.2f} | {summary['final']['val_top1']:.4f} |")


if __name__ == "__main__":
    main()
