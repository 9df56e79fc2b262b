"""The SLURM launcher's profile: one SLURM job of `nodes x tasks_per_node` tasks per run, its sbatch options,
and where `abtune study launch` puts its workers (`worker:`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from abtune.schema import StrictModel
from abtune.words import plural

# submitit sends the preemption signal (USR2) `signal_delay_s` before the limit and counts it as a
# *timeout* (which spends one of `max_requeues`) once the job ran min(0.8 x limit, limit - 10 min).
# At 10 minutes or less that bound is <= 0, so every preemption counts as a timeout; 15 minutes
# leaves a 5-minute window in which a preempted job is requeued for free and time to reach a checkpoint.
MIN_TIME_LIMIT_MIN = 15
NO_TIME_LIMIT = 0  # sbatch's --time=0: no limit but the partition's own
_NO_LIMIT_WORDS = ("unlimited", "infinite")  # sbatch takes these too, and squeue shows UNLIMITED
# sbatch options the profile sets through its own keys ("" : abtune sets them itself)
_TYPED_OPTIONS = {
    "partition": "partition", "account": "account", "qos": "qos", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
    "gpus-per-node": "gpus_per_node", "cpus-per-task": "cpus_per_task", "mem": "mem", "time": "time_limit",
    "chdir": "workdir", "signal": "signal_delay_s", "array": "array_parallelism", "job-name": "", "output": "",
    "error": "", "open-mode": "",
}


def parse_time_limit(value: int | str) -> int:
    """Minutes, rounded up, from an int (minutes) or any of sbatch's --time formats: "minutes",
    "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes", "days-hours:minutes:seconds";
    0, UNLIMITED or INFINITE: no limit (NO_TIME_LIMIT)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.lower() in _NO_LIMIT_WORDS:
        return NO_TIME_LIMIT
    days, clock = text.split("-", 1) if "-" in text else (None, text)
    fields = clock.split(":")
    if not all(f.isdigit() for f in [*fields, *([days] if days is not None else [])]) or not 1 <= len(fields) <= 3:
        raise ValueError("expected minutes or sbatch's [D-]HH:MM:SS (30, 30:00, 2:00:00, 1-12:00:00)")
    numbers = [int(f) for f in fields]
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        hours += 24 * int(days)
    else:  # minutes | minutes:seconds | hours:minutes:seconds
        hours, minutes, seconds = {1: [0, numbers[0], 0], 2: [0, *numbers], 3: numbers}[len(numbers)]
    return -(-((hours * 60 + minutes) * 60 + seconds) // 60)


def _check_time_limit(value: int | str) -> int | str:
    minutes = parse_time_limit(value)
    if minutes != NO_TIME_LIMIT and minutes < MIN_TIME_LIMIT_MIN:
        raise ValueError(
            f"{plural(minutes, 'minute')} is too short to checkpoint and requeue: submitit counts every signal in "
            f"a job of 10 minutes or less as a timeout; use at least {MIN_TIME_LIMIT_MIN} minutes, or 0 for no limit"
        )
    return value


class WorkerSection(StrictModel):
    """Where `abtune study launch` puts its worker jobs (1 task, no GPU each); unset keys: the profile's.
    A service or CPU partition keeps the workers off the nodes their trials need."""

    partition: str | None = Field(None, description="sbatch --partition of the workers")
    account: str | None = None
    qos: str | None = None
    time_limit: int | str | None = Field(None, description="minutes or [D-]HH:MM:SS; a worker requeues itself at it")
    cpus: int = Field(1, ge=1, description="CPUs per worker")

    @field_validator("time_limit")
    @classmethod
    def _long_enough(cls, value: int | str | None) -> int | str | None:
        return None if value is None else _check_time_limit(value)


class SlurmProfile(StrictModel):
    """One SLURM job of `nodes x tasks_per_node` tasks per run; every task is one rank."""

    kind: Literal["slurm"] = "slurm"
    partition: str | None = Field(None, description="sbatch --partition; default: the cluster's default")
    account: str | None = None
    qos: str | None = None
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1, description="ranks per node; one per GPU on a GPU cluster")
    gpus_per_node: int | None = Field(None, ge=0)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = Field(None, pattern=r"^\d+[KMGT]?$", description="memory per node, sbatch --mem (e.g. 64G)")
    time_limit: int | str = Field("1:00:00", description="minutes or [D-]HH:MM:SS; at least 15 minutes, 0 for no limit")
    setup: tuple[str, ...] = Field((), description="shell lines before the ranks start (module load ...)")
    sbatch: dict[str, str | int | bool] = Field({}, description="extra sbatch options, e.g. {constraint: a100}")
    array_parallelism: int = Field(8, ge=1, description="array jobs (study workers) running at once")
    max_requeues: int = Field(3, ge=0, description="times a job that hits its time limit is requeued")
    signal_delay_s: int = Field(120, ge=10, description="the preemption signal comes this long before the limit")
    python: str | None = Field(None, description="python on the nodes; default: the one running abtune")
    workdir: Path | None = Field(None, description="the jobs' working directory; default: where abtune runs")
    worker: WorkerSection = Field(WorkerSection(), description="`study launch` workers: partition, account, qos, "
                                                                "time_limit, cpus (default: the profile's, 1 CPU)")

    @field_validator("time_limit")
    @classmethod
    def _long_enough(cls, value: int | str) -> int | str:
        return _check_time_limit(value)

    @field_validator("sbatch")
    @classmethod
    def _not_a_typed_option(cls, value: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        for key in value:
            own = _TYPED_OPTIONS.get(key.replace("_", "-"))
            if own is not None:
                raise ValueError(f"{key} is set by abtune{f'; use the profile key {own}' if own else ''}")
        return value

    @property
    def time_limit_min(self) -> int:
        return parse_time_limit(self.time_limit)
