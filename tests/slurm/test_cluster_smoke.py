"""Smoke tests of submitit against the real single-machine SLURM cluster (fixture in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit import helpers
from submitit.core.utils import UncompletedJobError

from tests.conftest import wait_for
from tests.slurm.test_launcher_slurm import preempt

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # slow too: `-m "not slow"` is the quick subset

# The job's python cannot import this test module (tests/slurm is not on its sys.path):
# ship the functions and classes below by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------ job payloads
def where_am_i() -> tuple[int, int, str]:
    return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NODEID"]), os.environ["SLURMD_NODENAME"]


def sleep_after_marker(marker: str, seconds: float) -> str:
    Path(marker).write_text(os.environ["SLURM_JOB_ID"])
    time.sleep(seconds)
    return "not cancelled"


class CountTo(helpers.Checkpointable):
    """Counts slowly during its first run and quickly after being requeued.

    The counter and the log of runs only survive the requeue through checkpoint()
    (submitit re-pickles `self` in the preemption signal handler of rank 0).
    """

    def __init__(self) -> None:
        self.count = 0
        self.runs: list[tuple[int, int]] = []  # (SLURM_RESTART_COUNT, count at start) per run

    def __call__(self, progress: str, total: int, first_run_max_s: float) -> dict:
        self.runs.append((int(os.environ.get("SLURM_RESTART_COUNT", "0")), self.count))
        first_run = len(self.runs) == 1
        deadline = time.monotonic() + first_run_max_s
        while self.count < total:
            if first_run:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"never preempted within {first_run_max_s}s")
                time.sleep(0.05)
                Path(progress).write_text(str(self.count))
            self.count += 1
        return {"count": self.count, "runs": self.runs, "job_id": os.environ["SLURM_JOB_ID"]}


# ------------------------------------------------------------------ helpers
def _wait_done(job: submitit.Job, timeout_s: float) -> None:
    """Bounded replacement for job.wait() (which polls forever)."""
    try:
        wait_for(lambda: job.done(force_check=True), timeout_s, f"job {job.job_id} to finish")
    except AssertionError as e:
        state = job.state
        job.cancel(check=False)
        pytest.fail(f"{e} (state {state})\nstdout:\n{job.stdout()}\nstderr:\n{job.stderr()}", pytrace=False)


@pytest.fixture
def executor(slurm_cluster, tmp_path: Path) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    # timeout_min > 10: submitit treats a USR2 within min(0.8 * limit, limit - 10 min) as a
    # preemption (requeue, countdown untouched) rather than a timeout.
    ex.update_parameters(
        slurm_partition=slurm_cluster.partition, timeout_min=60, nodes=1, tasks_per_node=1, cpus_per_task=1
    )
    return ex


# ------------------------------------------------------------------ tests
def test_two_nodes_four_tasks(executor: submitit.AutoExecutor, slurm_cluster) -> None:
    executor.update_parameters(nodes=2, tasks_per_node=2)
    job = executor.submit(where_am_i)
    _wait_done(job, 120)
    results = job.results()

    assert sorted(rank for rank, _, _ in results) == [0, 1, 2, 3]
    assert {name for _, _, name in results} == set(slurm_cluster.nodes)
    assert {node_id for _, node_id, _ in results} == {0, 1}
    # SLURM_NODEID and SLURMD_NODENAME agree (hostname is the same on both virtual nodes)
    assert len({(node_id, name) for _, node_id, name in results}) == 2


def test_scancel_is_reported_as_cancelled(executor: submitit.AutoExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    job = executor.submit(sleep_after_marker, str(marker), 300)
    wait_for(marker.exists, 60, "the job to start")

    subprocess.run(["scancel", job.job_id], check=True, timeout=30)
    # needs a working sacct: without accounting submitit never learns the job is gone
    _wait_done(job, 60)

    assert job.state.startswith("CANCELLED"), job.state
    job._results_timeout_s = 1  # no result pickle will ever appear; don't wait the default 15 s
    exc = job.exception()
    assert isinstance(exc, UncompletedJobError), exc
    with pytest.raises(UncompletedJobError):
        job.result()


def test_preempted_checkpointable_job_resumes(executor: submitit.AutoExecutor, tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    job = executor.submit(CountTo(), str(progress), 1000, 120)

    def made_progress() -> bool:
        try:
            return int(progress.read_text() or 0) >= 5
        except (FileNotFoundError, ValueError):
            return False

    wait_for(made_progress, 60, "the first run to make progress")
    # SIGTERM then the preemption signal (USR2) to the job's tasks, in order; rank 0 calls
    # checkpoint(), dumps it over the submitted pickle and runs `scontrol requeue`.
    preempt(job)
    _wait_done(job, 120)
    result = job.result()

    assert result["job_id"] == job.job_id
    assert result["count"] == 1000
    assert len(result["runs"]) == 2, result["runs"]
    (first_restart, first_start), (second_restart, resumed_from) = result["runs"]
    assert (first_restart, first_start) == (0, 0)
    assert second_restart >= 1  # really requeued by slurm, not restarted by something else
    assert resumed_from >= 5  # the counter was carried through the checkpoint

    # done() returned on the result pickle; accounting catches up a moment later
    wait_for(lambda: job.watcher.get_state(job.job_id, mode="force") == "COMPLETED", 30, "sacct COMPLETED")
    history = subprocess.run(
        ["sacct", "-j", job.job_id, "--duplicates", "-X", "-n", "-P", "-o", "State"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    assert history == ["REQUEUED", "COMPLETED"], history
