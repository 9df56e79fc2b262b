"""A rank of a SLURM job that fails ends its process at once, without letting Python finalize, as a successful
one does: its peers' process group, torn down at finalization after a peer died, held the process (and the job,
and its nodes) until SLURM's SIGKILL. Here the slow teardown is an object whose finalizer sleeps; the rank runs
with the variables slurmd gives a task, outside any cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import with_checkout_on_path

RANK = """
import sys, time
import abtune.training.worker as worker
from abtune.launch.slurm.sbatch import RankJob

class SlowTeardown:
    def __del__(self):
        time.sleep(600)

def failing(run_dir, resume):
    global teardown
    teardown = SlowTeardown()  # finalized only if the interpreter finalizes
    raise RuntimeError("Connection closed by peer")

worker.run_rank = failing
RankJob(sys.argv[1])()
"""
TASK = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}


def test_a_failed_rank_ends_its_process_without_finalizing(tmp_path: Path) -> None:
    env = {k: v for k, v in with_checkout_on_path(os.environ).items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    ended = subprocess.run([sys.executable, "-c", RANK, str(tmp_path)], env={**env, **TASK}, capture_output=True,
                           text=True, timeout=120)  # on finalizing, the finalizer's 600 s sleep
    assert ended.returncode == 1, ended.stderr
    assert ended.stderr.rstrip().endswith("RuntimeError: Connection closed by peer"), ended.stderr  # still told
