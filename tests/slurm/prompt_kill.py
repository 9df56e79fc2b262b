"""The SIGKILL that ends a cancelled or requeued job, sent as soon as slurmd starts ending the job instead of 5 s
later. submitit's tasks ignore SIGTERM, and slurmd sends its SIGKILL max(KillWait, 5) s after it, the 5
hard-coded (README.md, Traps): the test cluster's KillWait=1 cannot shorten that. While `prompt_kill()` runs, a
thread reads what the nodes' slurmd logs gain every POLL_S; when one says a job was CANCELLED (scancel, a
requeue, a time limit), it SIGKILLs that job's tasks on this machine, as slurmd would. The job's fate
(CANCELLED, REQUEUED) is the controller's already; only SLURM's wait for it is skipped. It asks the daemons
nothing (no squeue: the RPC budget test counts the controller's calls) and starts no process."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.2
TASK_COMMAND = b"submitit.core._submit"  # every task of a job abtune or submitit submits
# The batch step's line as slurmd starts ending the job: "*** JOB 49 ON n1 CANCELLED AT ... DUE TO JOB REQUEUE ***".
# Not a step's "*** STEP 49.0 ON n1 CANCELLED AT": that one also comes of a mere SIGTERM (`scancel --signal`, the
# first half of a preemption), which the job must survive.
CANCELLED = re.compile(rb"\*\*\* JOB (\d+) ON \S+ CANCELLED AT")


def kill_tasks(job_ids: set[str]) -> None:
    """SIGKILL every task process of these jobs on this machine (found by the job id slurmd started it with:
    an array task's own id, as slurmstepd logs it)."""
    wanted = {b"SLURM_JOB_ID=" + job.encode() for job in job_ids}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if TASK_COMMAND in (proc / "cmdline").read_bytes() and wanted & set((proc / "environ").read_bytes().split(b"\0")):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile
            continue


class LogTail:
    """The complete lines a file gained since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.partial = b""

    def new_lines(self) -> bytes:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                chunk = log.read()
        except OSError:
            return b""
        self.offset += len(chunk)
        text, _, self.partial = (self.partial + chunk).rpartition(b"\n")
        return text


@contextlib.contextmanager
def prompt_kill(state_dir: Path) -> Iterator[None]:
    """While it runs: the tasks of every job the cluster in `state_dir` cancels get their SIGKILL at once."""
    tails = [LogTail(log) for log in sorted(state_dir.glob("slurmd/*/slurmd.log"))]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            ending = {match.decode() for tail in tails for match in CANCELLED.findall(tail.new_lines())}
            if ending:
                kill_tasks(ending)

    thread = threading.Thread(target=watch, name="prompt-kill", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
