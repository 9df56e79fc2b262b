"""How abtune follows SLURM jobs, counted by the controller itself: one squeue call answers for every
job a process follows (slurm.QueueView), and a job's end is read from the same call."""

from __future__ import annotations

import subprocess

import pytest

from abtune.launch.slurm import ENDED_STATES, QueueView
from tests.conftest import wait_for
from tests.slurm import rpc_counts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # slow too: `-m "not slow"` is the quick subset


def sbatch_sleep(partition: str) -> str:
    return subprocess.run(["sbatch", "--parsable", "-p", partition, "-N", "1", "-n", "1", "-o", "/dev/null", "--wrap", "sleep 120"],
                          check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def test_one_squeue_call_answers_for_every_followed_job_and_sees_them_end(slurm_cluster) -> None:
    jobs = [sbatch_sleep(slurm_cluster.partition) for _ in range(3)]
    view = QueueView(max_age_s=3600)
    for job in jobs:
        view.follow(job)
    rpc_counts.reset()
    try:
        assert all(view.state(job) in ("PENDING", "RUNNING", "CONFIGURING") for job in jobs)
        assert view.state(jobs[0]) and view.calls == 1  # fresh enough: no second call
        counts = rpc_counts.controller()
        assert rpc_counts.job_info(counts) == 1 and "REQUEST_FED_INFO" not in counts, counts  # --local
    finally:
        subprocess.run(["scancel", *jobs], check=True, timeout=30)

    ending = QueueView(max_age_s=0)
    for job in jobs:
        ending.follow(job)
    wait_for(lambda: all(ending.state(job) in ENDED_STATES for job in jobs), 60, "the cancelled jobs to end")
    assert {ending.state(job) for job in jobs} == {"CANCELLED"}
    # every squeue call of either view reached the controller as one RPC, nothing else did
    assert rpc_counts.job_info(rpc_counts.controller()) == 1 + ending.calls
