"""What packet loss costs: ddp and ab on the emulated launcher with a link that loses 0, 1 and 3% of
the packets reaching each node, side by side in one invocation, the arms interleaved and repeated.

    sudo python benchmarks/bench_lossy_link.py [--config studies/run_quickstart.yaml] [--steps 100]
        [--losses 0,1,3] [--bandwidth 1gbit] [--repeats 3]

Needs what the emulated launcher needs (root or CAP_NET_ADMIN, iproute2, iptables). Each run is one
`abtune train --launcher PROFILE` of 4 ranks as 2 simulated nodes. Per arm: the median training
seconds with the range over repeats, the TCP segments the nodes sent again (their own counters), the
bytes the links carried, and the final top-1 (loss changes timing, never the arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

MEGA = 1e6


def profile(folder: Path, bandwidth: str | None, loss: float) -> Path:
    path = folder / f"link-{loss:g}.yaml"
    path.write_text(yaml.safe_dump({"kind": "local", "fabric": {"bandwidth": bandwidth, "loss_pct": loss}}))
    return path


def train(config: Path, method: str, loss: float, repeat: int, args: argparse.Namespace, folder: Path) -> dict:
    run_dir = folder / f"{method}-{loss:g}-{repeat}"
    command = [sys.executable, "-m", "abtune.cli", "train", str(config), "--launcher",
               str(profile(folder, args.bandwidth, loss)), "--nproc", "4", "--ranks-per-node", "2",
               "--run-dir", str(run_dir), "--no-tracking", "--set", f"method.name={method}",
               "--set", f"train.steps={args.steps}"]
    subprocess.run(command, check=True, capture_output=True)
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--losses", default="0,1,3")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--methods", default="ddp,ab")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    losses = [float(x) for x in args.losses.split(",")]
    methods = args.methods.split(",")
    print(f"load before: {os.getloadavg()}", flush=True)
    results: dict[tuple[str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # interleaved: every arm once per round
            for method in methods:
                for loss in losses:
                    summary = train(args.config, method, loss, repeat, args, Path(tmp))
                    results.setdefault((method, loss), []).append(summary)
                    print(f"round {repeat}: {method} at {loss:g}% loss: {summary['timing']['train_seconds']:.1f} s",
                          flush=True)
    print(f"load after: {os.getloadavg()}")
    print("\n| method | loss % | train s (median, min-max) | vs 0% | TCP segments resent | link MB | top-1 |")
    print("|---|---|---|---|---|---|---|")
    for method in methods:
        base = statistics.median(s["timing"]["train_seconds"] for s in results[(method, losses[0])])
        for loss in losses:
            runs = results[(method, loss)]
            seconds = [s["timing"]["train_seconds"] for s in runs]
            links = [s["traffic"]["measured_inter_node_bytes"] for s in runs]
            resent = statistics.median(sum(m["link"]["tcp_retransmitted_segments"]) for m in links)
            top1 = {round(s["final"]["val_top1"], 4) for s in runs}
            print(f"| {method} | {loss:g} | {statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f}) | "
                  f"{statistics.median(seconds) / base:.2f}x | {resent:.0f} | "
                  f"{statistics.median(m['total'] for m in links) / MEGA:.1f} | {', '.join(map(str, sorted(top1)))} |")


if __name__ == "__main__":
    main()
