"""Run N ranks as processes on this machine, simulating N / ranks_per_node nodes.

Ranks fork from a warm server when the abtune command (or the test session) provides one
(abtune/launch/warm.py), else start as `python -m abtune.training.worker`; either way the launcher
sees a process it can poll, signal and wait for. The launcher watches its ranks: if one dies (an
error, a NaN loss, a kill), the others are stopped at once instead of waiting in a collective until
the timeout, and the first recorded failure becomes the one-line error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from abtune import jobenv
from abtune.errors import ConfigError, TrainingFailed
from abtune.launch import netns, warm
from abtune.launch.fabric import NodeNetwork, node_network
from abtune.launch.outcome import disk_full, first_lines
from abtune.launch.profiles import FabricProfile
from abtune.ports import free_port
from abtune.runfiles import FAILURES_DIR
from abtune.training.worker import QUIET_VARIABLE

POLL_SECONDS = 0.2
GRACE_SECONDS = 10.0
SETTLE_SECONDS = 1.0


class RankProcess(Protocol):
    """What the launcher needs of a rank: a subprocess.Popen (cold) or a warm.WarmRank."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def rank_environment(rank: int, nproc: int, ranks_per_node: int, port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in jobenv.JOB_VARIABLES}  # no job of ours
    env.update(
        RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank % ranks_per_node),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **{jobenv.NODE_RANK: str(rank // ranks_per_node)},
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), **{QUIET_VARIABLE: "1"},
    )
    return env


def check_layout(nproc: int, ranks_per_node: int) -> None:
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if ranks_per_node < 1 or nproc % ranks_per_node:
        raise ConfigError(f"--ranks-per-node {ranks_per_node} must divide --nproc {nproc}")


def launch(run_dir: Path, nproc: int, ranks_per_node: int, resume: bool = False,
           fabric: FabricProfile | None = None, job: dict[str, str] | None = None) -> None:
    """Start every rank, wait for all of them, raise TrainingFailed if any fails. With `fabric`, each
    simulated node's ranks run in a network namespace of their own, behind an emulated link. `job`: the
    identity of the scheduler's job these ranks run in (`Launcher.rank_identity`), where a launcher starts
    them as local processes inside its job."""
    check_layout(nproc, ranks_per_node)
    with node_network(fabric, nproc // ranks_per_node, run_dir, resume) as network:
        _run_ranks(run_dir, nproc, ranks_per_node, resume, network, job or {})


def _run_ranks(run_dir: Path, nproc: int, ranks_per_node: int, resume: bool, network: NodeNetwork,
               job: dict[str, str]) -> None:
    port = free_port()
    args = [str(run_dir)] + (["--resume"] if resume else [])
    processes = [
        start_rank(args, {**rank_environment(rank, nproc, ranks_per_node, port), **job,
                          **network.environment(rank // ranks_per_node)}, network.namespace(rank // ranks_per_node))
        for rank in range(nproc)
    ]
    try:
        failed = _wait(processes, network)
    except KeyboardInterrupt:
        _stop(processes)
        raise
    if failed is not None:
        time.sleep(SETTLE_SECONDS)  # let ranks that saw the failure record it before they are stopped
        codes = [p.poll() for p in processes]
        _stop(processes)
        raise TrainingFailed(_failure_message(run_dir, codes))


def start_rank(args: list[str], env: dict[str, str], namespace: str | None) -> RankProcess:
    """Inside network `namespace` if given; warm when a server is there and takes it, else cold."""
    rank = warm.spawn(args, env, namespace)
    if rank is not None:
        return rank
    prefix = netns.exec_prefix(namespace) if namespace else []
    return subprocess.Popen([*prefix, sys.executable, "-m", warm.WORKER_MODULE, *args], env=env)


def _wait(processes: list[RankProcess], network: NodeNetwork) -> int | None:
    """Block until all ranks exit (None) or one fails (its rank)."""
    while True:
        codes = [p.poll() for p in processes]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank
        if all(code == 0 for code in codes):
            return None
        network.sample()
        time.sleep(POLL_SECONDS)


def _stop(processes: list[RankProcess]) -> None:
    """Rank 0 last: it hosts the rendezvous store, and a peer that outlives it prints torch's C++ warning
    with a stack for every store call it can no longer make, under the launcher's one-line error."""
    _stop_together(processes[1:])
    _stop_together(processes[:1])


def _stop_together(processes: list[RankProcess]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + GRACE_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _failure_message(run_dir: Path, codes: list[int | None]) -> str:
    """The cause, not its echoes: an abtune error first (NaN loss, bad value), then a rank killed by
    a signal (its peers crash in their next collective), then any crash."""
    folder = run_dir / FAILURES_DIR
    errors = first_lines(sorted(folder.glob("error_rank_*.txt")))
    if errors:
        return errors[0]
    for rank, code in enumerate(codes):
        if code is not None and code < 0:
            return f"rank {rank} was killed by {signal.Signals(-code).name}"
    crashes = first_lines(sorted(folder.glob("crash_rank_*.txt")))
    if crashes:
        return crashes[0]
    full = disk_full(run_dir)  # the ranks could not even record why they failed
    if full:
        return full
    rank, code = next((r, c) for r, c in enumerate(codes) if c not in (None, 0))
    return f"rank {rank} exited with code {code}"
