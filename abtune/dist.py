"""Process-group set-up: who am I, how many are we, which node is each rank on.

Ranks read the usual torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). The node of a rank comes from ABTUNE_NODE_RANK (set by the local launcher, which
simulates nodes), else SLURM_NODEID, else torchrun's GROUP_RANK, else 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from abtune.comm import CommMeter, Op, Topology

NODE_RANK_VARIABLES = ("ABTUNE_NODE_RANK", "SLURM_NODEID", "GROUP_RANK")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _node_rank_from_environment() -> int:
    for name in NODE_RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return 0


def init_distributed(timeout_s: int) -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return DistEnv(rank, world_size, local_rank, _node_rank_from_environment(), backend, device)


def discover_topology(env: DistEnv) -> tuple[Topology, CommMeter]:
    """Gather every rank's node and return the topology with a meter that already counts that gather."""
    mine = torch.tensor([env.node_rank], dtype=torch.int64, device=env.device)
    gathered = torch.empty(env.world_size, dtype=torch.int64, device=env.device)
    dist.all_gather_single(gathered, mine)
    topology = Topology(tuple(int(n) for n in gathered.tolist()))
    meter = CommMeter(topology)
    # The gather ran before the meter could exist (it needs the topology); count it now.
    meter.record(Op.ALL_GATHER, gathered.nbytes, meter.world())
    return topology, meter


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
