"""The SLURM launcher, all of it: the launcher and its jobs (launcher.py), its profile (profile.py), sbatch
scripts and submission through submitit (sbatch.py), the shared squeue view and the queue questions
(queue.py), and what sinfo tells of the cluster's room (capacity.py). Nothing outside this package
names SLURM but the command line (tests/test_launcher_registry.py checks it).
"""

from abtune.launch.slurm.launcher import SlurmJob, SlurmLauncher
from abtune.launch.slurm.profile import SlurmProfile, WorkerSection, parse_time_limit
from abtune.launch.slurm.queue import (
    ENDED_STATES,
    QUEUE,
    QueueView,
    attach,
    in_queue,
    outcome,
)
from abtune.launch.slurm.sbatch import (
    POLL_SECONDS,
    STUDY_POLLS_PER_S,
    WORKER_LAYOUT,
    array_script,
    job_folder,
    master_port,
    poll_interval,
    sbatch_script,
    submit,
    submit_array,
    worker_profile,
)

__all__ = [
    "ENDED_STATES", "POLL_SECONDS", "QUEUE", "STUDY_POLLS_PER_S", "WORKER_LAYOUT", "QueueView", "SlurmJob", "SlurmLauncher",
    "SlurmProfile", "WorkerSection", "array_script", "attach", "in_queue", "job_folder", "master_port", "outcome",
    "parse_time_limit", "poll_interval", "sbatch_script", "submit", "submit_array", "worker_profile",
]
