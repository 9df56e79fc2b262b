"""SLURM through submitit: one job per run, one task per rank, requeued on preemption and timeout.

The sbatch script comes from submitit's own writer (`_make_sbatch_string`), for `--dry-run` and for
the real submission alike, so the two cannot drift. Every task runs `RankJob`: it exports the
torch.distributed variables from SLURM's (submitit's `TorchDistributedEnvironment`) and runs one
rank in its own process. `srun --kill-on-bad-exit` stops the other ranks when one fails.

Requeue: SLURM signals the job `signal_delay_s` before its time limit (or on preemption); submitit
calls `RankJob.checkpoint()` on rank 0 only, inside the signal handler, and requeues the job. The
handler saves nothing itself (it cannot run collectives): the requeued job resumes from the run's
latest periodic checkpoint (`train.checkpoint_every`), in the same run folder. A job requeued by
SLURM itself (`scontrol requeue`, a node failure) resumes the same way: SLURM_RESTART_COUNT > 0.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import shlex
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.helpers import Checkpointable, DelayedSubmission, TorchDistributedEnvironment
from submitit.slurm.slurm import _make_sbatch_string

from abtune import jobenv
from abtune.exiting import exit_without_finalizing
from abtune.launch.base import JOBS_DIR, JobVariables, Layout, SubmissionFailed
from abtune.launch.outcome import RunOutcome
from abtune.launch.slurm.profile import SlurmProfile
from abtune.runfiles import FAILURES_DIR

KIND = "slurm"
JOB_VARIABLES = JobVariables(job_id="SLURM_JOB_ID", node_rank="SLURM_NODEID", node_name="SLURMD_NODENAME")
POLL_SECONDS = 2.0  # a runner's squeue view of its jobs is at most this old (queue.QueueView)
STUDY_POLLS_PER_S = 2.0  # squeue calls a second that all workers of one `study launch` make together, at most
SRUN_ARGS = ("--kill-on-bad-exit=1",)  # one failed rank ends the job instead of hanging its peers


# --- study workers: light jobs of one task, no GPU (`abtune study launch`) --------------------
WORKER_LAYOUT = Layout(1, 1)
WORKER_REQUEUES = 100  # a worker outlives many time limits; each one requeues it
# sbatch options that ask for a node's accelerators or all of it: right for trials, not for a worker
_TRIAL_ONLY_OPTIONS = ("exclusive", "gres", "gpus", "gpus-per-task", "gpus-per-node", "mem-per-gpu", "mem-per-cpu")


def worker_profile(profile: SlurmProfile) -> SlurmProfile:
    """The profile of the worker jobs: the `worker:` section's partition, account, qos, time limit and
    CPUs, else the profile's (one CPU); the profile's setup; no GPU."""
    sbatch = {k: v for k, v in profile.sbatch.items() if k.replace("_", "-") not in _TRIAL_ONLY_OPTIONS}
    section = profile.worker
    own = {key: getattr(section, key) for key in ("partition", "account", "qos", "time_limit")
           if getattr(section, key) is not None}
    return profile.model_copy(update={"gpus_per_node": None, "cpus_per_task": section.cpus, "mem": None,
                                      "sbatch": sbatch, "max_requeues": WORKER_REQUEUES, **own})


# --- the job body, on every task --------------------------------------------------------------
class RankJob(Checkpointable):
    """One rank of a run; submitit pickles it, SLURM runs it once per task."""

    def __init__(self, run_dir: str, resume: bool = False) -> None:
        self.run_dir = run_dir
        self.resume = resume

    def __call__(self) -> RunOutcome:
        restarted = int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0
        export_rank_environment()
        # torch-heavy: imported once the environment is set
        from abtune.training.worker import run_rank

        if os.environ["RANK"] == "0":
            shutil.rmtree(Path(self.run_dir) / FAILURES_DIR, ignore_errors=True)  # left by an earlier attempt
        # After submitit has written the result or the error: end like a local rank, without finalizing
        # (worker's docstring). A rank whose peer died (a preempted or failed rank 0) finalized for 5 s
        # after its error: its job held its nodes until SLURM's SIGKILL. (Not SystemExit: submitit's
        # requeue on rank 0 exits its own way.)
        try:
            run_rank(Path(self.run_dir), self.resume or restarted)  # raises on failure: the task exits non-zero
        except Exception:
            atexit.register(exit_without_finalizing, 1)
            raise
        atexit.register(exit_without_finalizing, 0)
        return RunOutcome(True)

    def checkpoint(self) -> DelayedSubmission:
        """Rank 0, in the signal handler: resubmit this run with resume (the checkpoint is on disk)."""
        return DelayedSubmission(RankJob(self.run_dir, resume=True))


def export_rank_environment() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from SLURM's variables; node = SLURM_NODEID."""
    # Not CUDA_VISIBLE_DEVICES: SLURM already limits it to the node's GPUs (or the task's, with
    # --gpus-per-task), and dist.choose_device picks cuda:LOCAL_RANK or the task's only GPU.
    os.environ.setdefault("MASTER_PORT", str(master_port(os.environ["SLURM_JOB_ID"])))
    env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    os.environ["MASTER_ADDR"] = _reachable(env.master_addr)
    os.environ[jobenv.NODE_RANK] = "0"  # not one inherited from the submitter: SLURM_NODEID's below, where set
    os.environ.update(JOB_VARIABLES.identity(KIND))
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("SLURM_CPUS_PER_TASK", "1"))


FIRST_MASTER_PORT, MASTER_PORT_CHOICES = 20000, 12000  # 20000-31999: below Linux's ephemeral ports (32768+)


def master_port(job_id: str) -> int:
    """The same port on every rank of a job, from its id, below the range the kernel hands to outgoing
    connections (submitit's 20000-60000 met one on the first node in CI: EADDRINUSE). The id modulo the
    range, not a hash of it as submitit does: SLURM numbers jobs in order, so jobs that run at the same
    time on a node (a study's 1-node trials) get different ports unless 12000 jobs were submitted between
    them; hashed, concurrent trials on one host collide by chance as a study grows."""
    head = job_id.split("_")[0]  # SLURM_JOB_ID is a number; anything else is hashed
    number = int(head) if head.isdigit() else random.Random(job_id).randrange(MASTER_PORT_CHOICES)
    return FIRST_MASTER_PORT + number % MASTER_PORT_CHOICES


def _reachable(host: str) -> str:
    """The first node's name if it resolves, else the address of the node that runs the batch script."""
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return os.environ.get("SLURM_LAUNCH_NODE_IPADDR", host)
    return host


# --- the sbatch script ------------------------------------------------------------------------
def python_command(profile: SlurmProfile) -> str:
    return profile.python or shlex.quote(sys.executable)


def setup_lines(profile: SlurmProfile) -> list[str]:
    """The profile's lines, after exporting the PYTHONPATH abtune runs with (so the nodes import the same tree)."""
    lines = []
    if os.environ.get("PYTHONPATH"):
        lines.append(f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}")
    return lines + list(profile.setup)


def sbatch_parameters(profile: SlurmProfile, layout: Layout, job_name: str) -> dict[str, Any]:
    """submitit's names for the script's options; None means leave it to the cluster."""
    workdir = (profile.workdir or Path.cwd()).absolute()
    params: dict[str, Any] = {
        "job_name": job_name, "partition": profile.partition, "account": profile.account, "qos": profile.qos,
        "nodes": layout.nodes, "ntasks_per_node": layout.ranks_per_node,
        "gpus_per_node": profile.gpus_per_node or None, "cpus_per_task": profile.cpus_per_task,
        "mem": profile.mem, "time": profile.time_limit_min, "setup": setup_lines(profile),
        "signal_delay_s": profile.signal_delay_s, "array_parallelism": profile.array_parallelism,
        "srun_args": list(SRUN_ARGS), "additional_parameters": {"chdir": str(workdir), **profile.sbatch},
    }
    return {key: value for key, value in params.items() if value is not None}


def written_script(command: str, folder: Path, **parameters: Any) -> str:
    """The sbatch script submitit's SlurmExecutor submits for these parameters, by submitit's own writer. It is
    private (`_make_sbatch_string`): pyproject.toml bounds submitit's version, and
    tests/test_launcher_registry.py checks that the writer takes every parameter abtune passes."""
    return _make_sbatch_string(command=command, folder=folder, **parameters)


def job_folder(run_dir: Path) -> Path:
    return run_dir.absolute() / JOBS_DIR


def sbatch_script(run_dir: Path, layout: Layout, profile: SlurmProfile, job_name: str | None = None) -> str:
    """The script `submit` would hand to sbatch, written by submitit's own function; nothing is created."""
    folder = job_folder(run_dir)
    command = f"{python_command(profile)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return written_script(command, folder, **sbatch_parameters(profile, layout, job_name or _name(run_dir)))


def _name(run_dir: Path) -> str:
    return f"abtune-{run_dir.absolute().name}"


def array_script(folder: Path, layout: Layout, profile: SlurmProfile, count: int, job_name: str) -> str:
    """The script `submit_array` would hand to sbatch for `count` bodies; nothing is created."""
    command = f"{python_command(profile)} -u -m submitit.core._submit {shlex.quote(str(folder.absolute()))}"
    return written_script(command, folder.absolute(), map_count=count, **sbatch_parameters(profile, layout, job_name))


# --- submitting -------------------------------------------------------------------------------
_ALLOCATION_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")


@contextlib.contextmanager
def nested_submission() -> Iterator[None]:
    """Submit from inside a job (a study worker) as from a login node.

    sbatch copies the environment into the new job, and variables of the worker's own allocation
    (SLURM_ARRAY_TASK_ID, SLURM_CPUS_PER_TASK, SLURM_MEM_PER_NODE...) would leak into the trial's job:
    submitit would take the trial for an array task and look for its result under the wrong name.
    They are hidden while sbatch runs (SLURM_CONF stays); nothing changes on a login node.
    """
    hidden = {k: v for k, v in os.environ.items() if k.startswith(_ALLOCATION_PREFIXES) and k != "SLURM_CONF"}
    for key in hidden:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(hidden)

def make_executor(folder: Path, layout: Layout, profile: SlurmProfile, job_name: str) -> submitit.SlurmExecutor:
    """A submitit executor for this profile and layout; study workers may submit other bodies with it."""
    try:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=profile.max_requeues,
                                          python=python_command(profile))
    except RuntimeError as error:
        raise SubmissionFailed(f"no SLURM here ({error}); use --launcher local") from None
    executor.update_parameters(**sbatch_parameters(profile, layout, job_name))
    return executor


def submit(run_dir: Path, layout: Layout, profile: SlurmProfile, resume: bool = False,
           job_name: str | None = None) -> submitit.Job[RunOutcome]:
    executor = make_executor(job_folder(run_dir), layout, profile, job_name or _name(run_dir))
    with _sbatch_errors_in_one_line():
        return executor.submit(RankJob(str(run_dir.absolute()), resume))


def submit_array(folder: Path, layout: Layout, profile: SlurmProfile, bodies: list[Any],
                 job_name: str) -> list[submitit.Job[Any]]:
    """One job array, a task per body (e.g. `abtune study launch`'s W workers), at most
    `profile.array_parallelism` running at once; returns at once with the jobs (ids `ARRAY_INDEX`)."""
    executor = make_executor(folder, layout, profile, job_name)
    with _sbatch_errors_in_one_line():
        return executor.submit_array(bodies)


def submit_after(job_id: str, folder: Path, profile: SlurmProfile, body: Any, job_name: str) -> submitit.Job[Any]:
    """`body` as a light job (a study worker's: one task, no GPU) that starts once job `job_id` has ended,
    however it ended (`--dependency=afterany`: also cancelled while pending, or killed)."""
    light = worker_profile(profile)
    light = light.model_copy(update={"max_requeues": 0,
                                     "sbatch": {**light.sbatch, "dependency": f"afterany:{job_id}"}})
    executor = make_executor(folder, WORKER_LAYOUT, light, job_name)
    with _sbatch_errors_in_one_line():
        return executor.submit(body)


@contextlib.contextmanager
def _sbatch_errors_in_one_line() -> Iterator[None]:
    """An sbatch refusal becomes SubmissionFailed with one line (submitit would also print sbatch's stderr)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            yield
        except FailedJobError as error:
            raise SubmissionFailed(f"sbatch refused the job: {_sbatch_error(str(error))}") from None


def _sbatch_error(stderr: str) -> str:
    """sbatch's fatal line if any (no configuration, no controller), else its first error (invalid partition)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line.removeprefix("sbatch: fatal: ") for line in lines if line.startswith("sbatch: fatal: ")]
    errors = [line.removeprefix("sbatch: error: ") for line in lines]
    return (fatal or errors or ["no message"])[0]


def poll_interval(profile: SlurmProfile) -> float:
    """Seconds between a runner's polls of its jobs: POLL_SECONDS, longer in a study worker of a big
    array, so that the array's running workers together ask squeue at most STUDY_POLLS_PER_S times a
    second (64 workers: every 32 s). A trial's end is seen that much later; its training is not slowed."""
    workers = min(int(os.environ.get("SLURM_ARRAY_TASK_COUNT", "1")), profile.array_parallelism)
    return max(POLL_SECONDS, workers / STUDY_POLLS_PER_S)
