"""Whether a launched study's workers can keep its own trials from starting, and where workers go."""

from __future__ import annotations

import pytest

from abtune.launch.capacity import Node, nodes_left, pending_note, room_advice
from abtune.launch.profiles import SlurmProfile
from abtune.launch.slurm import STUDY_POLLS_PER_S, poll_interval, worker_profile

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
    pending = {"state": "PENDING", "reason": "Resources", "partition": "debug", "nodes": ""}
    worker = {"state": "RUNNING", "reason": "None", "partition": "debug", "nodes": "n1"}
    assert pending_note(pending, {"n1", "n2"}, [worker, worker]) == (
        " (Resources); the study's own workers hold CPUs on n1 of partition debug: it may wait for as long as "
        "they run (`worker: {partition: ...}` in the launcher profile keeps them apart)")
    assert pending_note(pending, {"g1", "g2"}, [worker]) == " (Resources)"  # workers on another partition
    assert pending_note({**pending, "reason": "Dependency"}, {"n1"}, [worker]) == " (Dependency)"


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
