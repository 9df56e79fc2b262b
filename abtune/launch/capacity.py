"""Can a launched study's workers keep its own trials from starting? Asked of SLURM (sinfo, squeue).
The SLURM launcher's answers to the study-worker questions of the launcher interface (base.py).

A worker holds its CPUs for as long as it runs, and SLURM places it on any node of its partition. A
trial job needs `nodes` nodes with `tasks_per_node x cpus_per_task` free CPUs each (a whole node
when `exclusive`). If the workers can sit so that fewer such nodes are left than a trial needs, the
trial pends (Resources) for as long as the workers wait for it: a deadlock. `study launch` refuses
that layout when sinfo tells the partitions' nodes; `study status` names the pending reason of each
trial job and says when the study's own running workers sit on the trial's partition.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from abtune.errors import ConfigError
from abtune.launch.profiles import Layout, SlurmProfile

SLURM_TIMEOUT_S = 30


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int


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


def partition_nodes(partition: str | None) -> list[Node] | None:
    """The nodes of a partition (None: the cluster's default one) and their CPUs; None when sinfo cannot tell."""
    out = slurm_output("sinfo", "-h", "-N", "-o", "%N %c %P")
    if out is None:
        return None
    nodes: dict[str, Node] = {}
    for line in out.splitlines():
        name, cpus, part = line.split()
        if (partition is None and part.endswith("*")) or part.rstrip("*") == partition:
            nodes[name] = Node(name, int(cpus))
    return list(nodes.values()) or None


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
    known, default = partitions()
    if not known:
        return "sinfo gave no partitions here: the partitions and the room workers leave trials were not checked"
    for label, name in (("partition", profile.partition), ("worker.partition", worker.partition)):
        if name is not None and name not in known:
            raise ConfigError(f"{label}: {name} is not a partition of this cluster (sinfo lists "
                              f"{', '.join(known)}); set one of them in the launcher profile")
    trial_nodes = partition_nodes(profile.partition)
    worker_nodes = partition_nodes(worker.partition)
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


def partitions() -> tuple[list[str], str | None]:
    """The cluster's partition names (sorted, without sinfo's `*`) and its default one, from one sinfo call;
    no names when sinfo cannot tell."""
    listed = [line.strip() for line in (slurm_output("sinfo", "-h", "-o", "%P") or "").splitlines() if line.strip()]
    default = next((name[:-1] for name in listed if name.endswith("*")), None)
    return sorted({name.rstrip("*") for name in listed}), default


def job_states(job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """squeue's view of the given jobs: state, reason, partition, nodes; jobs that left the queue are absent."""
    if not job_ids:
        return {}
    out = slurm_output("squeue", "-h", "-r", "-o", "%i|%T|%r|%P|%N")
    if out is None:
        return {}
    rows = (line.split("|") for line in out.splitlines())
    return {row[0]: {"state": row[1], "reason": row[2], "partition": row[3], "nodes": row[4]}
            for row in rows if row[0] in job_ids}


def queued(job_ids: Sequence[str]) -> list[str]:
    """The given jobs (array tasks as ARRAY_TASK) still in the queue: pending, running or ending."""
    if not job_ids:
        return []
    out = slurm_output("squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i", required=True)
    return [job for job in (out or "").split() if job in job_ids]


def trial_job_notes(trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
    """For each RUNNING trial (number -> SLURM job id): its job's state and pending reason, and whether
    the study's own running workers sit on its partition's nodes while it waits for resources."""
    states = job_states([*trial_jobs.values(), *worker_jobs])
    workers_running = [s for job, s in states.items() if job in worker_jobs and s["state"] == "RUNNING"]
    notes: dict[int, str] = {}
    for number, job in trial_jobs.items():
        state = states.get(job)
        if state is None:
            continue
        notes[number] = state["state"]
        if state["state"] == "PENDING":
            nodes = {n.name for n in partition_nodes(state["partition"]) or []} if workers_running else set()
            notes[number] += pending_note(state, nodes, workers_running)
    return notes


def pending_note(state: dict[str, str], partition_nodes: set[str], workers_running: list[dict[str, Any]]) -> str:
    """` (REASON)`, and when it waits for resources while the study's own workers run on its partition, that."""
    note = f" ({state['reason']})"
    holding = sorted({w["nodes"] for w in workers_running if w["nodes"] in partition_nodes})
    if state["reason"] not in ("Resources", "Priority") or not holding:
        return note
    return (f"{note}; the study's own workers hold CPUs on {', '.join(holding)} of partition {state['partition']}: "
            "it may wait for as long as they run (`worker: {partition: ...}` in the launcher profile keeps them apart)")
