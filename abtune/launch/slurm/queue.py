"""Following SLURM jobs: one squeue call per refresh for every job a process follows (QueueView), the
outcome of a run's job, and the queue questions of the launcher interface (`JobQueue`: which jobs are
still queued, cancel them, why a trial's job waits), answered from the same view.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from abtune.errors import ConfigError
from abtune.launch.outcome import RunOutcome, recorded_failure
from abtune.launch.slurm.capacity import cluster_partitions, never_starts, slurm_output
from abtune.launch.slurm.sbatch import POLL_SECONDS

SQUEUE_TIMEOUT_S = 30


# --- following a job --------------------------------------------------------------------------
def attach(job_id: str, folder: Path) -> submitit.Job[RunOutcome]:
    """The job with this id whose submitit files are in `folder` (RUN_DIR/jobs); rank 0's view."""
    return submitit.SlurmJob(folder=folder, job_id=job_id)


# SLURM's base job states that end a job (`squeue -t all` shows them for MinJobAge after the end). A
# job ending shows COMPLETING (the flag wins over the state in %T) until its processes are gone.
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"})
# Those in which SLURM killed the ranks (scancel, time limit, preemption, a lost node) rather than a rank failing.
ENDED_BY_SCHEDULER = frozenset({"CANCELLED", "DEADLINE", "NODE_FAIL", "PREEMPTED", "TIMEOUT"})


# Each call costs slurmctld two RPCs: the jobs (one: REQUEST_JOB_INFO_SINGLE, several: REQUEST_JOB_INFO)
# and the partitions, which squeue always loads; --local spares a third, the federation's (sdiag, 22.05).
# id, state, reason, node count, partition, node names
SQUEUE = ["squeue", "--local", "-h", "-r", "-t", "all", "-o", "%i|%T|%r|%D|%P|%N"]


@dataclass(frozen=True)
class QueueRow:
    """One job as squeue lists it."""

    state: str
    reason: str = ""
    nodes: int = 0
    partition: str = ""
    node_names: str = ""


class QueueView:
    """What squeue says of every job this process follows, from one squeue call per refresh for all.

    Asking per job (submitit's forced sacct, or `squeue -j ID`) costs slurmctld or slurmdbd one RPC per
    job per poll: a runner following P trials every 2 s makes P/2 calls a second, and W workers W
    times that. Here one `squeue -j ID,ID,...` answers for all of them, at most once per `max_age_s`
    (or sooner for a job the last call did not ask about). `squeue -t all` also shows a job's final
    state for MinJobAge (300 s by default) after it ended, so sacct is asked only about a job the
    controller has already forgotten (one re-attached long after its end). The queue questions of
    `study stop` and `study status` (which workers are queued, why a trial waits) use the same calls.
    """

    def __init__(self, max_age_s: float = POLL_SECONDS) -> None:
        self.max_age_s = max_age_s
        self.calls = 0  # squeue calls made, for the RPC budget test and benchmarks
        self.error = ""  # why the last call could not tell, if it could not
        self._followed: set[str] = set()
        self._asked: frozenset[str] = frozenset()
        self._rows: dict[str, QueueRow] | None = {}
        self._at = float("-inf")

    def follow(self, job_id: str) -> None:
        self._followed.add(job_id)

    def forget(self, job_id: str) -> None:
        self._followed.discard(job_id)

    def state(self, job_id: str) -> str | None:
        """The job's state in squeue; "" when squeue does not list it (ended long ago, or never
        existed), None when squeue cannot tell (it failed or timed out)."""
        self.follow(job_id)
        rows = self.rows([job_id])
        return None if rows is None else rows[job_id].state if job_id in rows else ""

    def pending(self, job_id: str) -> tuple[str, int, str] | None:
        """Why a job the last refresh saw PENDING waits (squeue's reason), its node count and partition."""
        row = (self._rows or {}).get(job_id)
        return (row.reason, row.nodes, row.partition) if row is not None and row.state == "PENDING" else None

    def rows(self, job_ids: Sequence[str]) -> dict[str, QueueRow] | None:
        """squeue's rows of the given jobs (those it lists), in the call that also asks about every job
        followed, made only when the last one is too old or did not ask about one of them; None when
        squeue cannot tell."""
        wanted = set(job_ids)
        if not wanted <= self._asked or time.monotonic() - self._at >= self.max_age_s:
            self._refresh(frozenset(self._followed | wanted))
        if self._rows is None:
            return None
        return {job: self._rows[job] for job in wanted if job in self._rows}

    def _refresh(self, asked: frozenset[str]) -> None:
        self.calls += 1
        try:
            listed = subprocess.run(SQUEUE + ["-j", ",".join(sorted(asked))], capture_output=True, text=True,
                                    timeout=SQUEUE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            self._rows, self.error = None, str(error)
        else:
            self._rows = _parse_rows(listed)
            self.error = (listed.stderr.strip().splitlines() or [f"exit code {listed.returncode}"])[-1]
        self._asked, self._at = asked, time.monotonic()


def _parse_rows(listed: subprocess.CompletedProcess[str]) -> dict[str, QueueRow] | None:
    """Each listed job's row."""
    if listed.returncode != 0:
        # one id the controller has forgotten: squeue -j asks for that job alone and refuses it
        return {} if "Invalid job id" in listed.stderr else None
    rows = {}
    for line in listed.stdout.splitlines():
        job_id, state, reason, nodes, partition, names = (line.strip().split("|") + [""] * 6)[:6]
        if job_id:
            rows[job_id] = QueueRow(state, reason, int(nodes) if nodes.isdigit() else 0, partition, names)
    return rows


QUEUE = QueueView()  # one per process: every SLURM job a runner follows shares its squeue calls


def in_queue(job_id: str) -> bool:
    """The job is pending, running or ending; False once it ended and its processes are gone."""
    current = QUEUE.state(job_id)
    if current is None or (current and current not in ENDED_STATES):
        return True
    QUEUE.forget(job_id)
    return False


def state(job: submitit.Job[Any]) -> str:
    """SLURM's state: squeue's while the controller knows the job, else sacct's, first word only
    ("CANCELLED by 0" -> "CANCELLED")."""
    current = QUEUE.state(job.job_id)
    if current:
        return current
    words = job.watcher.get_state(job.job_id, mode="force").split()
    return words[0] if words else "UNKNOWN"


def outcome(job: submitit.Job[Any], run_dir: Path) -> RunOutcome | None:
    """None while the job is pending, running, requeued or ending; else how it ended, the SLURM state
    as the reason. Costs no RPC of its own while the job runs: rank 0's result file and the shared
    squeue view tell; sacct is asked only about a job squeue no longer lists."""
    ended = _ended(job, run_dir)
    if ended is not None:
        QUEUE.forget(job.job_id)
    return ended


def _ended(job: submitit.Job[Any], run_dir: Path) -> RunOutcome | None:
    result = _success(job.task(0))
    if result is not None:
        return result
    current = QUEUE.state(job.job_id)
    if current == "PENDING":
        return _never_starts(job)
    if current is None or (current and current not in ENDED_STATES):
        return None
    result = _success(job.task(0))  # it may have ended with its result since the first look
    if result is not None:
        return result
    if not current:
        current = state(job)
        if not job.watcher.is_done(job.job_id, mode="cache"):  # slurmdbd has not recorded the end yet
            return None
    cause = recorded_failure(run_dir, crashes=current not in ENDED_BY_SCHEDULER)
    return RunOutcome(False, f"SLURM job {job.job_id} {current}" + (f": {cause}" if cause else ""), 1)


def _never_starts(job: submitit.Job[Any]) -> RunOutcome | None:
    """A pending job that can never start is cancelled, and ends with why (capacity.never_starts); None while
    it may yet start."""
    pending = QUEUE.pending(job.job_id)
    why = never_starts(*pending) if pending is not None else None
    if why is None:
        return None
    job.cancel(check=False)
    return RunOutcome(False, f"SLURM job {job.job_id} can never start: {why}; cancelled it: fix the launcher profile",
                      ConfigError.exit_code, never_started=True)


def _success(rank0: submitit.Job[Any]) -> RunOutcome | None:
    path = rank0.paths.result_pickle
    if not path.exists():
        return None
    status, value = submitit.core.utils.pickle_load(path)
    return value if status == "success" and isinstance(value, RunOutcome) else None


def job_states(job_ids: Sequence[str]) -> dict[str, QueueRow]:
    """The given jobs still in the queue (pending, running or ending), as squeue lists them."""
    rows = QUEUE.rows(job_ids) if job_ids else {}
    return {job: row for job, row in (rows or {}).items() if row.state not in ENDED_STATES}


def queued(job_ids: Sequence[str]) -> list[str]:
    """The given jobs (array tasks as ARRAY_TASK) still in the queue: pending, running or ending. A one-line
    ConfigError when squeue cannot tell; none where there is no squeue."""
    if not job_ids or shutil.which(SQUEUE[0]) is None:
        return []
    rows = QUEUE.rows(job_ids)
    if rows is None:
        raise ConfigError(f"squeue failed: {QUEUE.error}")
    return [job for job in job_ids if job in rows and rows[job].state not in ENDED_STATES]


def cancel(job_ids: Sequence[str]) -> None:
    """scancel; a job that ended meanwhile makes it complain, and callers ask the queue again afterwards."""
    if job_ids:
        slurm_output("scancel", *job_ids)


def trial_job_notes(trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
    """For each RUNNING trial (number -> SLURM job id): its job's state and pending reason, and whether
    the study's own running workers sit on its partition's nodes while it waits for resources."""
    states = job_states([*trial_jobs.values(), *worker_jobs])
    workers_running = [row for job, row in states.items() if job in worker_jobs and row.state == "RUNNING"]
    partitions = cluster_partitions()[0] if workers_running else {}  # one sinfo for every pending trial
    notes: dict[int, str] = {}
    for number, job in trial_jobs.items():
        row = states.get(job)
        if row is None:
            continue
        notes[number] = row.state
        if row.state == "PENDING":
            found = partitions.get(row.partition)
            notes[number] += pending_note(row, {n.name for n in found.nodes} if found else set(), workers_running)
    return notes


def pending_note(row: QueueRow, partition_nodes: set[str], workers_running: list[QueueRow]) -> str:
    """` (REASON)`, and when it waits for resources while the study's own workers run on its partition, that."""
    note = f" ({row.reason})"
    holding = sorted({w.node_names for w in workers_running if w.node_names in partition_nodes})
    if row.reason not in ("Resources", "Priority") or not holding:
        return note
    return (f"{note}; the study's own workers hold CPUs on {', '.join(holding)} of partition {row.partition}: "
            "it may wait for as long as they run (`worker: {partition: ...}` in the launcher profile keeps them apart)")
