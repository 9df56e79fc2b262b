"""qsub, qstat, qacct and qdel: each called with fixed options, its output parsed here and nowhere else."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from abtune.errors import AbtuneError
from abtune.launch.base import SubmissionFailed

TIMEOUT_S = 30
# qstat's state letters (man qstat): the ones a person reads as these words
_STATES = {"qw": "PENDING", "hqw": "HELD", "r": "RUNNING", "t": "STARTING", "Rr": "RUNNING", "dr": "ENDING"}


class GridEngineUnavailable(AbtuneError):
    """A Grid Engine command is missing here or does not answer."""


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which(tool)
    if path is None:
        raise GridEngineUnavailable(
            f"{tool} not found: Grid Engine's commands are not on PATH here; run abtune where qsub works "
            "(a login node of the cluster, after its settings.sh), or install gridengine-client")
    try:
        return subprocess.run([path, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GridEngineUnavailable(f"{tool} {' '.join(args)} did not answer within {TIMEOUT_S} s") from None


def qsub(script: Path) -> str:
    """Submit a job script; its job id. A refusal (an unknown queue or parallel environment) is one line."""
    try:
        done = _run("qsub", "-terse", str(script))
    except GridEngineUnavailable as error:
        raise SubmissionFailed(str(error)) from None
    job_id = done.stdout.strip().split(".")[0]
    if done.returncode != 0 or not job_id.isdigit():
        raise SubmissionFailed(f"qsub refused the job: {_qsub_error(done.stderr or done.stdout)}")
    return job_id


def queue_states() -> dict[str, str]:
    """Every job of every user in the queue (pending, running, ending) -> its state letters (qw, r, Eqw, dr)."""
    done = _run("qstat", "-u", "*")
    if done.returncode != 0:
        raise GridEngineUnavailable(f"qstat failed: {_last_line(done.stderr)}")
    states = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].isdigit():
            states[fields[0]] = fields[4]
    return states


def state_word(letters: str) -> str:
    """qstat's state letters as a person reads them: PENDING, RUNNING, ..."""
    return _STATES.get(letters, letters)


def error_reason(job_id: str) -> str:
    """Why a job in error state (Eqw) cannot start, as `qstat -j` says."""
    done = _run("qstat", "-j", job_id)
    found = re.search(r"^error reason\s+\S+\s+(.*)$", done.stdout, re.MULTILINE)
    return found.group(1).strip() if found else "no reason given"


def accounting(job_id: str) -> dict[str, str] | None:
    """The job's accounting record (`qacct -j`; its last run), None while the qmaster has not written it."""
    done = _run("qacct", "-j", job_id)
    if done.returncode != 0:
        return None
    record: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith("="):
            record = {}  # a rerun job has one record per run: keep the last
            continue
        key, _, value = line.partition(" ")
        if key:
            record[key] = value.strip()
    return record or None


def qdel(job_ids: list[str]) -> None:
    """Ask the jobs to stop; one that ended meanwhile is no error."""
    if job_ids:
        _run("qdel", *job_ids)


def _qsub_error(text: str) -> str:
    """qsub's reason (`Unable to run job: job rejected: the requested parallel environment "mpi" does not
    exist.`), without the `Exiting.` it ends with."""
    return _last_line("\n".join(line for line in text.splitlines() if line.strip() != "Exiting.")).removeprefix(
        "Unable to run job: ")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
