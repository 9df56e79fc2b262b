"""Can a launched study's workers keep its own trials from starting? Asked of SLURM's sinfo, once per check.
The SLURM launcher's answers to the study-worker questions of the launcher interface (base.py).

A worker holds its CPUs for as long as it runs, and SLURM places it on any node of its partition. A
trial job needs `nodes` nodes with `tasks_per_node x cpus_per_task` free CPUs each (a whole node
when `exclusive`). If the workers can sit so that fewer such nodes are left than a trial needs, the
trial pends (Resources) for as long as the workers wait for it: a deadlock. `study launch` refuses
that layout when sinfo tells the partitions' nodes; `study status` names the pending reason of each
trial job and says when the study's own running workers sit on the trial's partition.

A run's own request is checked against the same sinfo view (`check_request`: the partition, its node
count, per-job node and time limits, and the CPUs, memory and GPUs of its nodes), at `--dry-run` and at
submission; a job SLURM keeps PENDING for a reason that cannot clear (`never_starts`) is cancelled by
whoever follows it, with that reason in one line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from abtune.errors import ConfigError
from abtune.launch.base import Layout
from abtune.launch.slurm.profile import NO_TIME_LIMIT, SlurmProfile, parse_time_limit

SLURM_TIMEOUT_S = 30
# Each node of each partition, with the partition's limits: name, partition (default marked *), CPUs, memory
# (MB), generic resources (gpu:4, gpu:a100:4(S:0-1)), time limit ([D-]H:MM:SS, infinite), job size (1-infinite)
SINFO_NODES = ("sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G|%l|%s")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int = 0
    gpus: int = 0


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[Node, ...]
    max_time_min: int | None  # None: no limit
    max_nodes: int | None  # per job; None: no limit


def slurm_output(*args: str, required: bool = False) -> str | None:
    """A SLURM client's standard output; None when it is missing or fails (then nothing can be told),
    or with `required` a one-line ConfigError when it fails."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(args, 1, "", f"no answer in {SLURM_TIMEOUT_S} s")
    if done.returncode != 0 and required:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise ConfigError(f"{args[0]} failed: {lines[-1]}")
    return done.stdout if done.returncode == 0 else None


def cluster_partitions() -> tuple[dict[str, Partition], str | None]:
    """Every partition with nodes (sinfo), by name, and the default one's name; nothing when sinfo cannot tell."""
    rows: dict[str, list[list[str]]] = {}
    default = None
    for line in (slurm_output(*SINFO_NODES) or "").splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7:
            continue
        name = fields[1].rstrip("*")
        default = name if fields[1].endswith("*") else default
        rows.setdefault(name, []).append(fields)
    found = {}
    for name, fields in rows.items():
        nodes = {f[0]: Node(f[0], int(f[2]), _number(f[3]), _gpus(f[4])) for f in fields}
        found[name] = Partition(name, tuple(nodes.values()), _minutes(fields[0][5]), _largest_job(fields[0][6]))
    return found, default


def _number(text: str) -> int:
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


def _gpus(gres: str) -> int:
    """GPUs in sinfo's generic resources: `gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,gpu:v100:2`; `(null)`: none."""
    return sum(_number(item.split("(")[0].split(":")[-1]) for item in gres.split(",") if item.startswith("gpu:"))


def _minutes(limit: str) -> int | None:
    """A partition's time limit in minutes; None for none (infinite, UNLIMITED) or none sinfo could tell (n/a)."""
    try:
        minutes = parse_time_limit(limit)
    except ValueError:
        return None
    return None if minutes == NO_TIME_LIMIT else minutes


def _largest_job(size: str) -> int | None:
    largest = size.rpartition("-")[2]
    return int(largest) if largest.isdigit() else None


def partition_nodes(partition: str | None) -> list[Node] | None:
    """The nodes of a partition (None: the cluster's default one) and their CPUs; None when sinfo cannot tell."""
    found, default = cluster_partitions()
    return _nodes_of(found, partition or default)


def _nodes_of(found: dict[str, Partition], partition: str | None) -> list[Node] | None:
    chosen = found.get(partition or "")
    return list(chosen.nodes) if chosen is not None else None


def check_partition(label: str, name: str | None, known: Sequence[str]) -> None:
    if name is not None and name not in known:
        raise ConfigError(f"{label}: {name} is not a partition of this cluster (sinfo lists "
                          f"{', '.join(known)}); set one of them in the launcher profile")


def check_request(profile: SlurmProfile, layout: Layout) -> str | None:
    """Refuse (one line) a job of `layout` on this profile that the cluster can never start: a partition it
    lacks, more nodes than the partition has or allows a job, a longer time limit than the partition's, more
    CPUs, memory or GPUs per node than enough of its nodes have. Returns what could not be checked (sinfo
    missing or silent), else None."""
    found, default = cluster_partitions()
    if not found:
        return "sinfo gave no partitions here: the request was not checked against the cluster"
    check_partition("partition", profile.partition, sorted(found))
    partition = found.get(profile.partition or default or "")
    if partition is None:
        return "sinfo names no default partition: the request was not checked against the cluster"
    where, nodes = f"partition {partition.name}", partition.nodes
    if layout.nodes > len(nodes):
        raise ConfigError(f"launcher profile: nodes {layout.nodes}, but {where} has {len(nodes)} node(s) "
                          f"({', '.join(n.name for n in nodes)}; sinfo); ask for at most {len(nodes)}")
    if partition.max_nodes is not None and layout.nodes > partition.max_nodes:
        raise ConfigError(f"launcher profile: nodes {layout.nodes}, but {where} allows a job at most "
                          f"{partition.max_nodes} (sinfo); ask for at most {partition.max_nodes}")
    if partition.max_time_min is not None and profile.time_limit_min > partition.max_time_min:
        raise ConfigError(f"launcher profile: time_limit {profile.time_limit} is {profile.time_limit_min} minutes, "
                          f"but {where} allows a job at most {partition.max_time_min} (sinfo); shorten it")
    _check_node_resources(profile, layout, where, nodes)
    return None


def _check_node_resources(profile: SlurmProfile, layout: Layout, where: str, nodes: Sequence[Node]) -> None:
    cpus = layout.ranks_per_node * (profile.cpus_per_task or 1)
    memory = _memory_mb(profile.mem) if profile.mem else 0
    gpus = profile.gpus_per_node or 0
    asks = {"CPUs": (cpus, f"tasks_per_node {layout.ranks_per_node} x cpus_per_task {profile.cpus_per_task or 1}",
                     lambda n: n.cpus),
            "MB of memory": (memory, f"mem {profile.mem}", lambda n: n.memory_mb),
            "GPUs": (gpus, f"gpus_per_node {gpus}", lambda n: n.gpus)}
    for what, (need, asked, has) in asks.items():
        most = max(has(n) for n in nodes)
        if need > most:
            raise ConfigError(f"launcher profile: {asked} asks {need} {what} per node, but no node of {where} has "
                              f"more than {most} (sinfo)")
    fitting = [n for n in nodes if all(has(n) >= need for need, _, has in asks.values())]
    if len(fitting) < layout.nodes:
        raise ConfigError(f"launcher profile: nodes {layout.nodes} of {cpus} CPUs, {memory} MB and {gpus} GPUs each, "
                          f"but only {len(fitting)} node(s) of {where} have that much (sinfo); ask for fewer or less")


def _memory_mb(mem: str) -> int:
    """sbatch's --mem (megabytes unless K, M, G or T follows) in MB."""
    factor = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(mem[-1], 1)
    return int(_number(mem) * factor)


# Why a job may pend for ever (squeue's reasons that no change in the cluster's load clears; the
# per-job limits of an association or QOS are AssocMax...PerJob... and QOSMax...PerJob...).
NEVER_STARTS = {
    "PartitionConfig": "the partition's configuration cannot hold it",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "BadConstraints": "its constraints can not be satisfied",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "DependencyNeverSatisfied": "its dependency will never be satisfied",
}


def never_starts(reason: str, nodes: int, partition: str) -> str | None:
    """Why a PENDING job (squeue's reason, node count, partition) can never start; None when it may yet.
    PartitionNodeLimit also means that nodes are down or drained, which may clear: when sinfo tells the
    partition's nodes, only a job asking more nodes than the partition has or allows never starts; when it
    cannot tell, the reason alone decides (a request beyond the partition is by far the likelier cause,
    and a job left pending for it would wait for ever unseen)."""
    if reason in NEVER_STARTS:
        return f"it pends for {reason} ({NEVER_STARTS[reason]})"
    if re.fullmatch(r"(Assoc|QOS)Max\w*PerJob\w*|QOSMin\w+", reason):
        return f"it pends for {reason} (it breaks a per-job limit of its account or QOS)"
    if reason == "PartitionNodeLimit":
        found = cluster_partitions()[0].get(partition)
        if found is None:
            return (f"it pends for PartitionNodeLimit (it asks {nodes} node(s), more than partition {partition} "
                    "has, allows a job or has up; sinfo could not tell which)")
        if nodes > len(found.nodes) or nodes > (found.max_nodes or nodes):
            return (f"it pends for PartitionNodeLimit (it asks {nodes} node(s); partition {partition} has "
                    f"{len(found.nodes)}" + (f", at most {found.max_nodes} a job" if found.max_nodes else "") + ")")
    return None


def nodes_left(nodes: Sequence[Node], shared: set[str], need: int | None, workers: int, worker_cpus: int) -> int:
    """Nodes still able to take one trial rank set (`need` CPUs; None: a whole node) when `workers`
    workers of `worker_cpus` CPUs each sit where they block the most; only `shared` nodes can hold workers."""
    usable = [n for n in nodes if need is None or n.cpus >= need]
    costs = []  # workers it takes to block each usable node the workers can reach
    for node in usable:
        if node.name in shared and node.cpus >= worker_cpus:
            free_to_fill = 1 if need is None else node.cpus - need + 1
            costs.append(-(-free_to_fill // worker_cpus))
    blocked = 0
    for cost in sorted(costs):
        if cost > workers:
            break
        workers -= cost
        blocked += 1
    return len(usable) - blocked


def check_workers_leave_room(profile: SlurmProfile, worker: SlurmProfile, layout: Layout, workers: int,
                             rerun: str) -> str | None:
    """Refuse (one line) a partition the cluster does not have, or a launch whose workers can keep every trial
    from starting, with advice that works (`rerun`: the `abtune study run ...` that drives the study from here
    instead). Returns what could not be checked (sinfo missing or silent), else None."""
    found, default = cluster_partitions()  # one sinfo answers every question below
    known = sorted(found)
    if not known:
        return "sinfo gave no partitions here: the partitions and the room workers leave trials were not checked"
    for label, name in (("partition", profile.partition), ("worker.partition", worker.partition)):
        check_partition(label, name, known)
    trial_nodes = _nodes_of(found, profile.partition or default)
    worker_nodes = _nodes_of(found, worker.partition or default)
    if trial_nodes is None or worker_nodes is None:
        return "sinfo listed no nodes of the partitions: the room workers leave trials was not checked"
    shared = {n.name for n in trial_nodes} & {n.name for n in worker_nodes}
    exclusive = bool(profile.sbatch.get("exclusive"))
    need = None if exclusive else layout.ranks_per_node * (profile.cpus_per_task or 1)
    cpus = worker.cpus_per_task or 1
    if nodes_left(trial_nodes, shared, need, workers, cpus) >= layout.nodes:
        return None
    where = profile.partition or "the default partition"
    asks = "whole nodes" if need is None else f"{need} CPU(s) on each"
    fewer = next((w for w in range(workers - 1, 0, -1) if nodes_left(trial_nodes, shared, need, w, cpus) >= layout.nodes), 0)
    elsewhere = [p for p in known if p != (profile.partition or default)]
    raise ConfigError(
        f"{workers} worker(s) of {cpus} CPU(s) on the nodes of {where} can keep every trial from starting (a trial "
        f"asks {layout.nodes} node(s), {asks}; the partition has {len(trial_nodes)} node(s) of "
        f"{'/'.join(sorted({str(n.cpus) for n in trial_nodes}))} CPUs): {room_advice(fewer, elsewhere, rerun)}")


def room_advice(fewer: int, elsewhere: Sequence[str], rerun: str) -> str:
    """What works instead: fewer workers if some fit, another partition for them if the cluster has one, and
    always the study driven from the login node (trials as SLURM jobs, no worker job)."""
    ways = [f"launch at most {fewer} worker(s)"] if fewer else []
    if elsewhere:
        ways.append(f"put the workers on another partition (`worker: {{partition: {elsewhere[0]}}}` in the "
                    "launcher profile)")
    ways.append(f"run the study from this login node instead: `{rerun}` (every trial a SLURM job, no worker job)")
    return "; or ".join(ways)
