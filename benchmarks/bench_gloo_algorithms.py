"""Which algorithm gloo runs for each collective abtune uses, read off the links of an emulated fabric.

    sudo python benchmarks/bench_gloo_algorithms.py [--nodes 2 --ranks-per-node 2] [--megabytes 4]

Starts the ranks of 2 x 2 (or N x R) simulated nodes in their namespaces (abtune/launch/fabric.py),
runs each collective `--repeats` times on a payload of `--megabytes` (all-gather: that much per rank),
and prints, per node, the TCP payload that left the node per collective (link counters minus 66 header
bytes a packet, minus a run without the collective) as a multiple of the payload. A ring all-reduce
sends 2(n-1)/n x payload over each hop that leaves a node; gloo's binomial-tree broadcast sends the
whole payload once per child on another node.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from abtune.launch.fabric import HEADER_BYTES, Fabric, FabricSpec
from abtune.launch.local import free_port

RANK_SCRIPT = """
import sys, torch, torch.distributed as dist
op, floats, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
tensor = torch.ones(floats)
for _ in range(repeats):
    if op == "all_reduce":
        dist.all_reduce(tensor)
    elif op == "broadcast":
        dist.broadcast(tensor, src=0)
    elif op == "all_gather":
        dist.all_gather_single(torch.empty(floats * dist.get_world_size()), tensor)
dist.destroy_process_group()
"""


def payload_sent(fabric: Fabric, nodes: int, per_node: int, op: str, floats: int, repeats: int) -> list[int]:
    before = fabric.counters()
    port, processes = free_port(), []
    for rank in range(nodes * per_node):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node), "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", **fabric.node_environment(rank // per_node)}
        command = [*fabric.node_prefix(rank // per_node), sys.executable, "-c", RANK_SCRIPT, op, str(floats), str(repeats)]
        processes.append(subprocess.Popen(command, env=env))
    if any(p.wait() for p in processes):
        raise SystemExit(f"{op}: a rank failed")
    after = fabric.counters()
    return [(a.tx_bytes - b.tx_bytes) - HEADER_BYTES * (a.tx_packets - b.tx_packets) for a, b in zip(after, before, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    floats = int(args.megabytes * 1e6) // 4
    fabric = Fabric.create(FabricSpec(nodes=args.nodes))
    try:
        idle = payload_sent(fabric, args.nodes, args.ranks_per_node, "none", floats, 0)
        print(f"{args.nodes} nodes x {args.ranks_per_node} ranks, {args.megabytes} MB payload, "
              f"{args.repeats} repeats; set-up alone: {idle} bytes per node")
        for op in ("all_reduce", "broadcast", "all_gather"):
            sent = payload_sent(fabric, args.nodes, args.ranks_per_node, op, floats, args.repeats)
            multiples = [(s - i) / args.repeats / (floats * 4) for s, i in zip(sent, idle, strict=True)]
            print(f"{op}: payload that left each node / payload = {[round(m, 4) for m in multiples]}")
    finally:
        fabric.remove()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
