"""Whether a launched study's workers can keep its own trials from starting, and where workers go."""

from __future__ import annotations

import re

import pytest

from abtune.errors import ConfigError
from abtune.launch.base import Layout
from abtune.launch.slurm import STUDY_POLLS_PER_S, SlurmProfile, poll_interval, worker_profile
from abtune.launch.slurm.capacity import (
    Node,
    _check_node_resources,
    _gpus,
    _largest_job,
    _memory_mb,
    _minutes,
    never_starts,
    nodes_left,
    room_advice,
)
from abtune.launch.slurm.queue import QueueRow, pending_note

TWO_BY_TWO = [Node("n1", 2), Node("n2", 2)]
TEST_CLUSTER = [Node("n1", 4), Node("n2", 4)]


@pytest.mark.parametrize(
    ("nodes", "need", "workers", "worker_cpus", "left"),
    [
        (TWO_BY_TWO, 2, 2, 1, 0),  # issue 15: both workers on n1 and n2 would each block a trial node
        (TWO_BY_TWO, 2, 1, 1, 1),  # one worker blocks one of the two nodes a trial needs
        (TEST_CLUSTER, 1, 2, 1, 2),  # 4 CPUs, 1 for the trial: 4 workers on a node to block it
        (TEST_CLUSTER, 2, 2, 3, 0),  # 3-CPU workers leave 1 CPU where the trial needs 2
        (TEST_CLUSTER, None, 1, 1, 1),  # exclusive trials: any worker blocks its whole node
        ([Node(f"g{i}", 76) for i in range(100)], None, 8, 1, 92),  # a large partition: plenty left
        ([Node("small", 1), Node("n1", 4)], 2, 2, 1, 1),  # a node too small for the trial is never counted
    ],
)
def test_nodes_left_when_workers_sit_where_they_block_most(nodes: list[Node], need: int | None, workers: int,
                                                           worker_cpus: int, left: int) -> None:
    assert nodes_left(nodes, {n.name for n in nodes}, need, workers, worker_cpus) == left


def test_workers_in_another_partition_block_nothing() -> None:
    assert nodes_left(TWO_BY_TWO, set(), 2, 8, 1) == 2


def test_worker_section_sets_where_workers_run() -> None:
    profile = SlurmProfile(partition="gpu", account="proj", qos="normal", time_limit="4:00:00", gpus_per_node=4,
                           cpus_per_task=19, sbatch={"exclusive": True, "constraint": "a100"},
                           worker={"partition": "service", "time_limit": "1-00:00:00", "cpus": 2})
    worker = worker_profile(profile)
    assert (worker.partition, worker.account, worker.qos, worker.time_limit_min) == ("service", "proj", "normal", 1440)
    assert (worker.cpus_per_task, worker.gpus_per_node, worker.sbatch) == (2, None, {"constraint": "a100"})
    default = worker_profile(SlurmProfile(partition="gpu", cpus_per_task=19))
    assert (default.partition, default.cpus_per_task, default.time_limit_min) == ("gpu", 1, 60)


def test_a_trial_pending_on_nodes_its_own_workers_hold_is_named() -> None:
    pending = QueueRow("PENDING", "Resources", 1, "debug", "")
    worker = QueueRow("RUNNING", "None", 1, "debug", "n1")
    assert pending_note(pending, {"n1", "n2"}, [worker, worker]) == (
        " (Resources); the study's own workers hold CPUs on n1 of partition debug: it may wait for as long as "
        "they run (`worker: {partition: ...}` in the launcher profile keeps them apart)")
    assert pending_note(pending, {"g1", "g2"}, [worker]) == " (Resources)"  # workers on another partition
    assert pending_note(QueueRow("PENDING", "Dependency", 1, "debug"), {"n1"}, [worker]) == " (Dependency)"


def test_room_advice_names_only_what_works() -> None:
    rerun = "abtune study run s --launcher c.yaml"
    login = f"run the study from this login node instead: `{rerun}` (every trial a SLURM job, no worker job)"
    assert room_advice(0, [], rerun) == login
    assert room_advice(2, ["cpu"], rerun) == ("launch at most 2 worker(s); or put the workers on another partition "
                                              f"(`worker: {{partition: cpu}}` in the launcher profile); or {login}")


@pytest.mark.parametrize(("array_tasks", "parallelism", "seconds"),
                         [(None, 8, 2.0), ("4", 8, 2.0), ("16", 16, 8.0), ("64", 64, 32.0), ("64", 8, 4.0)])
def test_a_worker_of_a_big_array_polls_so_the_array_asks_squeue_at_most_twice_a_second(
        monkeypatch: pytest.MonkeyPatch, array_tasks: str | None, parallelism: int, seconds: float) -> None:
    """Only the array's running workers poll: `array_parallelism` of them at most."""
    if array_tasks is None:
        monkeypatch.delenv("SLURM_ARRAY_TASK_COUNT", raising=False)
    else:
        monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", array_tasks)
    profile = SlurmProfile(array_parallelism=parallelism)
    assert poll_interval(profile) == seconds
    assert min(int(array_tasks or 1), parallelism) / poll_interval(profile) <= STUDY_POLLS_PER_S


def test_what_sinfo_says_of_nodes_and_partitions_is_read() -> None:
    assert [_gpus(g) for g in ("(null)", "gpu:4", "gpu:a100:4(S:0-1)", "gpu:a100:2,gpu:v100:2,mps:100")] == [0, 4, 4, 4]
    assert [_minutes(t) for t in ("infinite", "UNLIMITED", "30:00", "2:00:00", "1-00:00:00")] == [None, None, 30, 120, 1440]
    assert [_largest_job(size) for size in ("1-infinite", "1-4", "infinite", "8")] == [None, 4, None, 8]
    assert [_memory_mb(mem) for mem in ("500", "512M", "64G", "1T")] == [500, 512, 65536, 1048576]


GPU_PARTITION = [Node("g1", 76, 512000, 4), Node("g2", 76, 512000, 4), Node("c1", 128, 1024000, 0)]


@pytest.mark.parametrize(("profile", "layout", "expected"), [
    ({"gpus_per_node": 8, "tasks_per_node": 8}, Layout(1, 8),
     "gpus_per_node 8 asks 8 GPUs per node, but no node of partition gpu has more than 4 (sinfo)"),
    ({"tasks_per_node": 4, "cpus_per_task": 40}, Layout(1, 4),
     "tasks_per_node 4 x cpus_per_task 40 asks 160 CPUs per node, but no node of partition gpu has more than 128"),
    ({"mem": "2T"}, Layout(1, 1), "mem 2T asks 2097152 MB of memory per node, but no node of partition gpu has more"),
    ({"gpus_per_node": 4, "tasks_per_node": 4}, Layout(3, 4),  # the CPU node has no GPU: 2 nodes fit, not 3
     "nodes 3 of 4 CPUs, 0 MB and 4 GPUs each, but only 2 node(s) of partition gpu have that much (sinfo)"),
])
def test_a_node_request_the_partition_cannot_hold_is_refused(profile: dict, layout: Layout, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        _check_node_resources(SlurmProfile(**profile), layout, "partition gpu", GPU_PARTITION)
    _check_node_resources(SlurmProfile(gpus_per_node=4, tasks_per_node=4), Layout(2, 4), "partition gpu", GPU_PARTITION)


@pytest.mark.parametrize(("reason", "never"), [
    ("PartitionTimeLimit", "it pends for PartitionTimeLimit (its time limit exceeds the partition's)"),
    ("InvalidQOS", "it pends for InvalidQOS (its QOS is invalid)"),
    ("AssocMaxWallDurationPerJobLimit", "it pends for AssocMaxWallDurationPerJobLimit (it breaks a per-job limit"),
    ("QOSMaxGRESPerJob", "it pends for QOSMaxGRESPerJob (it breaks a per-job limit"),
    ("Resources", None), ("Priority", None), ("ReqNodeNotAvail, UnavailableNodes:n1", None),
    ("QOSMaxJobsPerUserLimit", None),  # the user's other jobs end: it clears
    ("AssocGrpCpuLimit", None), ("JobHeldUser", None), ("BeginTime", None),
])
def test_only_reasons_that_cannot_clear_give_a_pending_job_up(reason: str, never: str | None) -> None:
    found = never_starts(reason, 1, "debug")
    assert (found is None) if never is None else (found is not None and found.startswith(never)), found
