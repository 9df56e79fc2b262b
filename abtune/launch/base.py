"""The launcher interface: where the ranks of a run start, and the job that follows them.

Like Optuna's samplers, launchers are small swappable pieces behind one interface; everything above
`abtune/launch/` (the command line, studies, promotion) talks to them only through it:

    launcher = load_launcher("slurm")                       # launchers.py: a profile file -> a Launcher
    layout = launcher.layout(nproc, ranks_per_node)          # ranks and nodes of one run
    job = launcher.submit(run_dir, layout, resume=False)     # returns at once (debug: runs on poll)
    result = job.poll()                                      # None while queued or running
    kind, record = job.kind, job.record()                    # stored by a study trial, and later
    job = reattach(kind, record, run_dir)                    # followed from another process

What is cluster-specific beyond one run is the launcher's too, so that `abtune/study/` never names a
cluster: the study workers `abtune study launch` submits (`submit_workers`), whether they leave the
trials room to start (`check_worker_room`), which of them are still queued or to cancel
(`queued`, `cancel`), and why a trial's job waits (`waiting_notes`). A launcher whose jobs end with
the process that started them answers these trivially (`launches_workers = False`).

A run folder's config.yaml is written before `submit` (abtune/rundir.py); a job's body never raises
for a failed run: its outcome is a RunOutcome with the one-line cause.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TextIO

from abtune.config import RunConfig
from abtune.errors import AbtuneError, ConfigError
from abtune.launch.outcome import RunOutcome

DEFAULT_TIMEOUT_MIN = 24 * 60
DEFAULT_LAUNCHER = "local"  # the kind `--launcher` means when it is not given
POLL_SECONDS = 0.5


class SubmissionFailed(AbtuneError):
    """The launcher refused the job (sbatch: unknown partition, impossible request; no SLURM here)."""


@contextlib.contextmanager
def exported(env: dict[str, str] | None) -> Iterator[None]:
    """`env` set in this process for the block, then what was there before: what the processes started
    meanwhile inherit (a local job's controller, sbatch's copy, a warm server), never written to a file."""
    before = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class Layout:
    """How many ranks a run has and how they sit on nodes (real ones on SLURM, simulated locally)."""

    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


class Job(ABC):
    """One submitted run. `kind` and `record()` let another process follow it later (`reattach`)."""

    kind: ClassVar[str]
    label: ClassVar[str] = "job"  # how a person calls it: "SLURM job 812", "local job 4711"
    outlives_driver: ClassVar[bool] = False  # keeps running when the process that submitted it stops
    followable: ClassVar[bool] = False  # another process can follow it from its record() (`reattach`)
    legacy_attr: ClassVar[str | None] = None  # the trial attribute earlier versions kept its record() in

    def __init__(self, job_id: str, run_dir: Path) -> None:
        self.job_id = job_id
        self.run_dir = run_dir

    @abstractmethod
    def poll(self) -> RunOutcome | None:
        """How the run ended, or None while it is queued or running."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask the job to stop; `poll` says when it has."""

    def gone(self) -> bool:
        """Every process of the job has exited: it writes nothing more (SLURM: it left the queue)."""
        return self.poll() is not None

    def record(self) -> Any:
        """A JSON value naming this job for `reattach` from another process (default: its id)."""
        return self.job_id

    @property
    def state(self) -> str:
        return "RUNNING" if self.poll() is None else "DONE"

    def describe(self) -> str:
        return f"{self.label} {self.job_id}"

    @classmethod
    def id_of(cls, record: Any) -> str:
        """The job id that `record()` names, for a report that does not follow the job."""
        return str(record)

    def watch_command(self) -> str | None:
        """A shell command that shows how the job is doing (SLURM: squeue); None when there is none."""
        return None

    def cancel_command(self) -> str | None:
        """A shell command that stops the job from anywhere (SLURM: scancel); None when there is none."""
        return None

    def wait(self, poll_s: float = POLL_SECONDS) -> RunOutcome:
        while (result := self.poll()) is None:
            time.sleep(poll_s)
        return result

    def follow(self, out: TextIO = sys.stdout, poll_s: float = POLL_SECONDS) -> RunOutcome:
        """Wait, telling `out` what a person at the terminal should know meanwhile (default: nothing)."""
        return self.wait(poll_s)

    @classmethod
    def reattach(cls, record: Any, run_dir: Path) -> Job | None:
        """The job `record()` named in another process, to follow from here; None when it cannot be
        (the default: such jobs end with the process that started them)."""
        return None


class Launcher(ABC):
    """Starts the ranks of prepared run folders. Built from a typed profile (profiles.py)."""

    kind: ClassVar[str]
    job_type: ClassVar[type[Job]]  # the jobs it submits; `job_type.reattach` follows one from another process
    poll_s: ClassVar[float] = POLL_SECONDS  # how often a driver polls this launcher's jobs
    runs_studies: ClassVar[bool] = True
    jobs_outlive_driver: ClassVar[bool] = False  # its jobs run on when abtune stops following them (SLURM)
    launches_workers: ClassVar[bool] = False  # `abtune study launch` can submit study workers through it
    worker_key: ClassVar[str | None] = None  # in a study worker's stamp: the job of this kind it runs in

    def __init__(self, profile: Any) -> None:
        self.profile = profile
        self.source: str | None = None  # the `--launcher NAME|PATH` it was loaded from, to say how to run again

    # --- where the ranks go -------------------------------------------------------------------
    @abstractmethod
    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        """The layout of one run: the command line's --nproc/--ranks-per-node, or the profile's."""

    def trial_layout(self, nproc: int, ranks_per_node: int, measures_inter_node: bool) -> Layout:
        """The layout of every trial of a study whose `layout:` says nproc x ranks_per_node."""
        return self.layout(nproc, ranks_per_node)

    def resized(self, layout: Layout) -> Launcher:
        """This launcher for runs of `layout` (SLURM: a job of that many nodes and tasks)."""
        return self

    def batch_script(self, run_dir: Path, layout: Layout, job_name: str | None = None) -> str | None:
        """The script a batch system would run for this run; None when there is none."""
        return None

    def check_request(self, layout: Layout, config: RunConfig | None = None) -> str | None:
        """Refuse (ConfigError, one line) a run of `layout` (and `config`, where known) that this launcher can
        never start. Returns what could not be checked, None when all was (or there was nothing to check)."""
        return None

    def describe(self, run_dir: Path, layout: Layout, run_name: str) -> str:
        """What `--dry-run` prints: the batch script, or one line."""
        script = self.batch_script(run_dir, layout)
        if script is not None:
            return script
        return (f"{self.kind}: {layout.world_size} rank(s) of run {run_name} in {run_dir} "
                f"({layout.nodes} simulated node(s) x {layout.ranks_per_node})\n")

    # --- jobs ---------------------------------------------------------------------------------
    @abstractmethod
    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        """Start the run prepared in `run_dir`; returns at once. `env`: variables its processes get."""

    def after(self, job: Job, body: Callable[[], Any], folder: Path) -> Job | None:
        """Run `body` once `job` has ended, however it ended, with no process of ours following it (logs in
        `folder`); None where a job ends with the process that started it (the driver sees its end)."""
        return None

    def run(self, run_dir: Path, layout: Layout, *, resume: bool = False, out: TextIO = sys.stdout) -> RunOutcome:
        """Run in the foreground: submit and follow to the end (Ctrl-C: KeyboardInterrupt)."""
        return self.submit(run_dir, layout, resume=resume).follow(out, self.poll_s)

    # --- study workers (`abtune study launch`) --------------------------------------------------
    def submit_workers(self, folder: Path, body: Callable[[], Any], count: int, job_name: str) -> list[str]:
        """Submit `count` study workers running `body`, logs in `folder`; their job ids, at once."""
        raise self.workers_refused()

    def workers_script(self, folder: Path, count: int, job_name: str) -> str:
        """What `study launch --dry-run` prints for the workers."""
        raise self.workers_refused()

    def check_worker_room(self, layout: Layout, count: int, rerun: str) -> str | None:
        """Refuse (ConfigError, with advice that works; `rerun` drives the study from here instead)
        `count` workers that could keep every trial of `layout` from starting. Returns what could
        not be checked, None when all was (or there was nothing to check)."""
        return None

    def watch_workers_command(self, job_name: str) -> str | None:
        """A shell command that lists the study's workers (SLURM: squeue --name); None when there is none."""
        return None

    def workers_refused(self, study: str = "NAME") -> ConfigError:
        """Why `study launch` cannot use this launcher (`launches_workers` is False), and what works."""
        return ConfigError(f"--launcher {self.source or self.kind}: `study launch` submits study workers that run "
                           f"on after it returns, which {self.kind} jobs do not; use a slurm profile, or run the "
                           f"study here with `abtune study run {study}`")

    @classmethod
    def job_environment(cls) -> str | None:
        """The job of this kind this process runs in (a launched study worker), None outside one."""
        return None

    @classmethod
    def rerun_args(cls, source: str | None, nproc: int, ranks_per_node: int) -> list[str]:
        """`abtune train` options that run a trial's config again where it ran: through the trial's profile
        (`source`; the default launcher needs none) in the study's layout."""
        via = ["--launcher", source] if source not in (None, DEFAULT_LAUNCHER) else []
        return [*via, "--nproc", str(nproc), "--ranks-per-node", str(ranks_per_node)]

    # --- jobs recorded by id (study workers, trial jobs), asked about from any process --------
    @classmethod
    def queued(cls, job_ids: Sequence[str]) -> list[str]:
        """Those of the given jobs still pending, running or ending."""
        return []

    @classmethod
    def cancel(cls, job_ids: Sequence[str]) -> None:
        """Ask the given jobs to stop (a job that ended meanwhile is no error)."""

    @classmethod
    def waiting_notes(cls, trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
        """For running trials (number -> job id): the state of their job and why it waits, where known."""
        return {}
