"""The launcher interface: where the ranks of a run start, and the job that follows them.

Like Optuna's samplers, launchers are small swappable pieces behind one interface; everything above
`abtune/launch/` (the command line, studies, promotion) talks to them only through it:

    launcher = load_launcher("local")                        # launchers.py: a profile file -> a Launcher
    layout = launcher.layout(nproc, ranks_per_node)          # ranks and nodes of one run
    job = launcher.submit(run_dir, layout, resume=False)     # returns at once (debug: runs on poll)
    result = job.poll()                                      # None while queued or running
    kind, record = job.kind, job.record()                    # stored by a study trial, and later
    job = reattach(kind, record, run_dir)                    # followed from another process

The core (`Launcher`) is what every launcher has: its profile schema (`profile_type`), the layout of a
run, `submit`, and the `Job` it returns (follow, cancel, describe). What only some schedulers can do is
a capability, a small mixin a launcher class adds and callers test with `isinstance`/`issubclass`, as
Optuna asks a sampler for its optional hooks:

- `JobQueue`: jobs recorded by id, asked about and cancelled from any process (`queued`, `cancel`), and
  why a trial's job waits (`waiting_notes`);
- `StudyWorkers` (a `JobQueue`): the study workers `abtune study launch` submits, which run on after it
  returns (`submit_workers`, `workers_script`, `check_worker_room`), and the job a worker runs in.

A rank learns of its job through abtune's own variables (abtune/jobenv.py), which its launcher exports
from its scheduler's as the rank starts (`job_variables`, `rank_identity`).

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

from abtune import jobenv
from abtune.config import RunConfig
from abtune.errors import AbtuneError
from abtune.launch.outcome import RunOutcome
from abtune.schema import StrictModel

DEFAULT_TIMEOUT_MIN = 24 * 60
JOBS_DIR = "jobs"  # in a run folder: its job's files (logs, the submitted body, its result)
DEFAULT_LAUNCHER = "local"  # the kind `--launcher` means when it is not given
POLL_SECONDS = 0.5


class SubmissionFailed(AbtuneError):
    """The launcher refused the job (the scheduler refused it, or there is no scheduler here)."""


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
class JobVariables:
    """The variables in which a scheduler tells each rank of its job which job, node rank and node it is."""

    job_id: str
    node_rank: str | None = None
    node_name: str | None = None

    def identity(self, kind: str) -> dict[str, str]:
        """abtune's variables (jobenv.py) from the scheduler's in this process's environment: what a rank of
        a job of launcher `kind` exports as it starts, before training reads them."""
        found = {jobenv.JOB_ID: self.job_id, jobenv.NODE_RANK: self.node_rank, jobenv.NODE_NAME: self.node_name}
        identity = {ours: os.environ[theirs] for ours, theirs in found.items() if theirs and theirs in os.environ}
        return {jobenv.JOB_KIND: kind, **identity} if jobenv.JOB_ID in identity else identity


@dataclass(frozen=True)
class Layout:
    """How many ranks a run has and how they sit on nodes (real ones on a cluster, simulated locally)."""

    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


class Job(ABC):
    """One submitted run. `kind` and `record()` let another process follow it later (`reattach`)."""

    kind: ClassVar[str]
    label: ClassVar[str] = "job"  # how a person calls it: "local job 4711"
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
        """Every process of the job has exited: it writes nothing more (a queued job: it left the queue)."""
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
        """A shell command that shows how the job is doing (a queue's status command); None when there is none."""
        return None

    def cancel_command(self) -> str | None:
        """A shell command that stops the job from anywhere (a queue's cancel command); None when there is none."""
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
    """Starts the ranks of prepared run folders; built from its typed profile (`profile_type`).

    Required: `layout` and `submit` (whose Job follows, cancels and describes the run). The rest has
    defaults that fit a launcher whose jobs end with the process that started them."""

    kind: ClassVar[str]  # the profile's `kind:`, the key in the registry (launchers.py)
    profile_type: ClassVar[type[StrictModel]]  # the profile schema, with a `kind: Literal[kind]` field
    job_type: ClassVar[type[Job]]  # the jobs it submits; `job_type.reattach` follows one from another process
    poll_s: ClassVar[float] = POLL_SECONDS  # how often a driver polls this launcher's jobs
    runs_studies: ClassVar[bool] = True
    jobs_outlive_driver: ClassVar[bool] = False  # its jobs run on when abtune stops following them
    # The scheduler's variables that tell a rank its job, node rank and node name (None: it sets none)
    job_variables: ClassVar[JobVariables | None] = None

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
        """This launcher for runs of `layout` (a batch system: a job of that many nodes and tasks)."""
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

    @classmethod
    def rerun_args(cls, source: str | None, nproc: int, ranks_per_node: int) -> list[str]:
        """`abtune train` options that run a trial's config again where it ran: through the trial's profile
        (`source`; the default launcher needs none) in the study's layout."""
        via = ["--launcher", source] if source not in (None, DEFAULT_LAUNCHER) else []
        return [*via, "--nproc", str(nproc), "--ranks-per-node", str(ranks_per_node)]

    @classmethod
    def rank_identity(cls) -> dict[str, str]:
        """abtune's variables for a rank of this launcher's job (jobenv.py), from its scheduler's."""
        return cls.job_variables.identity(cls.kind) if cls.job_variables is not None else {}


# --- capabilities: what only some launchers can do ---------------------------------------------
class JobQueue(ABC):
    """A launcher whose jobs sit in a queue that any process can ask about by job id (a batch scheduler)."""

    @classmethod
    @abstractmethod
    def queued(cls, job_ids: Sequence[str]) -> list[str]:
        """Those of the given jobs still pending, running or ending."""

    @classmethod
    @abstractmethod
    def cancel(cls, job_ids: Sequence[str]) -> None:
        """Ask the given jobs to stop (a job that ended meanwhile is no error)."""

    @classmethod
    def waiting_notes(cls, trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
        """For running trials (number -> job id): the state of their job and why it waits, where known."""
        return {}


class StudyWorkers(JobQueue):
    """A launcher that can submit the study workers of `abtune study launch`: jobs that run the study on
    after `study launch` returns, found and cancelled later through the queue (`study stop`)."""

    worker_key: ClassVar[str]  # in a study worker's stamp: the job of this kind it runs in

    @abstractmethod
    def submit_workers(self, folder: Path, body: Callable[[], Any], count: int, job_name: str) -> list[str]:
        """Submit `count` study workers running `body`, logs in `folder`; their job ids, at once."""

    @abstractmethod
    def workers_script(self, folder: Path, count: int, job_name: str) -> str:
        """What `study launch --dry-run` prints for the workers."""

    @classmethod
    @abstractmethod
    def job_environment(cls) -> str | None:
        """The job of this kind this process runs in (a launched study worker), None outside one."""

    def check_worker_room(self, layout: Layout, count: int, rerun: str) -> str | None:
        """Refuse (ConfigError, with advice that works; `rerun` drives the study from here instead)
        `count` workers that could keep every trial of `layout` from starting. Returns what could
        not be checked, None when all was (or there was nothing to check)."""
        return None

    def watch_workers_command(self, job_name: str) -> str | None:
        """A shell command that lists the study's workers; None when there is none."""
        return None
