"""Process-group set-up: who am I, how many are we, which node is each rank on.

Ranks read the usual torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). The node of a rank comes from ABTUNE_NODE_RANK (set by the launcher that started it: the
local launcher simulates nodes, a cluster's copies its scheduler's; abtune/jobenv.py), else torchrun's
GROUP_RANK, else 0.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from abtune import jobenv
from abtune.comm import CommMeter, Op, Topology, all_gather_single, check_device
from abtune.errors import ConfigError

NODE_RANK_VARIABLES = (jobenv.NODE_RANK, "GROUP_RANK")


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


def choose_device(local_rank: int, visible_gpus: int) -> torch.device:
    """cuda:LOCAL_RANK when a task sees all of its node's GPUs (--gpus-per-node); cuda:0 when it sees
    only its own (--gpus-per-task gives each task its own CUDA_VISIBLE_DEVICES); the CPU without GPUs."""
    if visible_gpus == 0:
        return torch.device("cpu")
    if visible_gpus == 1:
        return torch.device("cuda", 0)
    if local_rank < visible_gpus:
        return torch.device("cuda", local_rank)
    raise ConfigError(
        f"local rank {local_rank} has no GPU of its own: this task sees {visible_gpus} GPUs; ask for at least "
        "as many GPUs per node as tasks per node (the launcher's gpus_per_node and tasks_per_node)"
    )


def init_distributed(timeout_s: int) -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = choose_device(local_rank, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return DistEnv(rank, world_size, local_rank, _node_rank_from_environment(), backend, device)


def discover_topology(env: DistEnv) -> tuple[Topology, CommMeter]:
    """Gather every rank's node and return the topology with a meter that already counts that gather."""
    mine = torch.tensor([env.node_rank], dtype=torch.int64, device=env.device)
    gathered = torch.empty(env.world_size, dtype=torch.int64, device=env.device)
    for tensor in (mine, gathered):
        check_device(tensor, env.device, "all_gather of the node ranks over group 'world'")
    all_gather_single(gathered, mine)
    topology = Topology(tuple(int(n) for n in gathered.tolist()))
    meter = CommMeter(topology, env.device, env.rank)
    # The gather ran before the meter could exist (it needs the topology); count it now.
    meter.record(Op.ALL_GATHER, gathered.nbytes, meter.world())
    return topology, meter


def node_name() -> str:
    """The name of this rank's node: its scheduler's (the one to drain; jobenv.py), else the host's."""
    return os.environ.get(jobenv.NODE_NAME) or socket.gethostname()


PROGRESS_KEY = "abtune/progress/"


class StoreBoard:
    """Every rank's progress (abtune/training/hang.py) in the run's rendezvous store, the TCPStore that rank 0
    serves at MASTER_ADDR:MASTER_PORT, through a client of its own: the process group's client must not wait
    behind it, and its long timeout keeps c10d from logging while a hung rank reads a store that does not answer
    (the detector gives up on it sooner)."""

    def __init__(self, world_size: int, timeout_s: int) -> None:
        self.world_size = world_size
        self._store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                    timeout=timedelta(seconds=timeout_s), wait_for_workers=False)

    def publish(self, rank: int, record: str) -> None:
        self._store.set(f"{PROGRESS_KEY}{rank}", record)

    def read(self) -> list[str | None]:
        keys = [f"{PROGRESS_KEY}{rank}" for rank in range(self.world_size)]
        present = [key for key in keys if self._store.check([key])]  # get would wait for a key never set
        values = dict(zip(present, self._store.multi_get(present), strict=True)) if present else {}
        return [values[key].decode() if key in values else None for key in keys]


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
