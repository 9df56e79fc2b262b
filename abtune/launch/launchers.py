"""The launcher registry (`LAUNCHER_TYPES`) and the launchers that need no scheduler: local processes
(optionally on an emulated fabric) and one in-process debug rank. `load_launcher(NAME|PATH)` builds a
launcher from its profile, parsed with the `profile_type` of the registered launcher its `kind` names.

Beside this module: local.py starts ranks as processes, warm.py forks them from a warm server, fabric.py
emulates an interconnect; each scheduler's launcher is a package of its own (slurm/), registered here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import submitit

from abtune import jobenv
from abtune.attrs import JOB_ATTR, RUN_ID_ATTR
from abtune.config import RunConfig
from abtune.errors import AbtuneError, ConfigError
from abtune.launch import local
from abtune.launch.base import (
    DEFAULT_LAUNCHER,
    DEFAULT_TIMEOUT_MIN,
    JOBS_DIR,
    Job,
    JobQueue,
    Launcher,
    Layout,
    StudyWorkers,
    exported,
)
from abtune.launch.gridengine import GridEngineLauncher
from abtune.launch.outcome import RunOutcome, disk_full
from abtune.launch.pids import process_alive, process_start
from abtune.launch.profiles import (
    DebugProfile,
    FabricProfile,
    LocalProfile,
    resolve_profile_path,
    validate_profile,
)
from abtune.launch.slurm import SlurmLauncher
from abtune.ports import free_port
from abtune.yamlfile import read_yaml


def load_launcher(name_or_path: str) -> Launcher:
    """The launcher of a profile: `--launcher NAME|PATH` (see profiles.resolve_profile_path)."""
    launcher = launcher_for(load_profile(name_or_path))
    launcher.source = name_or_path
    return launcher


def launcher_for(profile: Any) -> Launcher:
    """The launcher of a parsed profile (`parse_profile`), by its kind."""
    return LAUNCHERS[profile.kind](profile)


def load_profile(name_or_path: str) -> Any:
    """The profile `--launcher NAME|PATH` names (profiles.resolve_profile_path), parsed by its launcher's schema."""
    path = resolve_profile_path(name_or_path)
    return parse_profile(read_yaml(path), str(path))


def parse_profile(raw: dict[str, Any], source: str) -> Any:
    """A profile from its plain values (a YAML file's, or a `model_dump` sent to a study worker): the
    `profile_type` of the launcher its `kind` names."""
    launcher = LAUNCHERS.get(raw.get("kind"))  # type: ignore[arg-type]
    if launcher is None:
        raise ConfigError(f"{source}: kind: expected one of {', '.join(LAUNCHERS)} (got {raw.get('kind')!r})")
    return validate_profile(launcher.profile_type, raw, source)


def default_launcher() -> Launcher:
    """What runs a study's trials when no `--launcher` is given: local processes, no profile file."""
    return LAUNCHERS[DEFAULT_LAUNCHER](LocalProfile())


# --- local processes -------------------------------------------------------------------------------
def run_local_job(run_dir: str, nproc: int, ranks_per_node: int, resume: bool,
                  fabric: FabricProfile | None = None) -> RunOutcome:
    """The body of a local job, in its controller's task: SIGTERM (how abtune cancels it) and SIGINT stop the
    ranks, whatever this process inherited (submitit's own SIGTERM handler would ignore it)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    return run_local_ranks(run_dir, nproc, ranks_per_node, resume, fabric)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_local_ranks(run_dir: str, nproc: int, ranks_per_node: int, resume: bool,
                    fabric: FabricProfile | None = None) -> RunOutcome:
    """The body of a local job: start the ranks as processes on this machine and wait for them."""
    try:
        local.launch(Path(run_dir), nproc, ranks_per_node, resume=resume, fabric=fabric)
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


class LocalJob(Job):
    """A submitit local job: a controller process on this host that starts and waits for the ranks."""

    kind = "local"
    label = "local job"
    followable = True  # its controller outlives a SIGKILLed driver; its record names it on this host
    legacy_attr = "local_job"

    def __init__(self, job: submitit.Job[RunOutcome], run_dir: Path) -> None:
        super().__init__(str(job.job_id), run_dir)
        self._job = job

    def poll(self) -> RunOutcome | None:
        if not self._job.done():
            return None
        if not self._job.paths.result_pickle.exists():
            # The controller has ended, so its task has written all it will: submitit would wait 15 s
            # for a result that a cancelled or killed job never writes.
            return _without_result(self.job_id, self.run_dir, self._job.paths)
        return _result(self._job)

    def cancel(self) -> None:
        if not self._job.done():
            cancel_controller(int(self.job_id))

    def record(self) -> dict[str, Any]:
        """The controller's pid (submitit's job id) with its start time (a reused pid is not the job),
        its host, and its folder (the result file)."""
        pid = int(self.job_id)
        return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid),
                "folder": str(self._job.paths.folder)}

    @classmethod
    def id_of(cls, record: Any) -> str:
        return str(record["pid"])

    @classmethod
    def reattach(cls, record: Any, run_dir: Path) -> Job | None:
        """A job of this host whose controller still runs or left its result; not one of another host."""
        if record.get("host") != socket.gethostname():
            return None
        job = LocalJobHere(record, run_dir)
        return job if not job.ended() or job.has_result() else None


class LocalJobHere(Job):
    """A local job started by another (dead) process on this host. Its controller is not our child, so
    its end is seen by the process disappearing, and its result read from its result file."""

    kind = "local"
    label = "local job"

    def __init__(self, record: dict[str, Any], run_dir: Path) -> None:
        super().__init__(str(record["pid"]), run_dir)
        self._record = record
        self._job: submitit.LocalJob[Any] = submitit.LocalJob(folder=Path(record["folder"]), job_id=self.job_id)

    def ended(self) -> bool:
        return not process_alive(self._record)

    def has_result(self) -> bool:
        return self._job.paths.result_pickle.exists()

    def poll(self) -> RunOutcome | None:
        if not self.ended():
            return None
        if not self.has_result():  # submitit would wait for a result that a killed controller never writes
            return _without_result(self.job_id, self.run_dir, self._job.paths)
        return _result(self._job)

    def cancel(self) -> None:
        if not self.ended():
            cancel_controller(int(self._record["pid"]))

    def record(self) -> dict[str, Any]:
        return self._record


def cancel_controller(pid: int) -> None:
    """SIGTERM to a local job's controller, which passes it to its task (run_local_job): that stops the ranks,
    and the controller ends with them. Not SIGINT, as submitit cancels: a process started in the background
    (`nohup ... &`, a script's `&`) passes SIGINT on ignored to every process it starts, controllers included."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


class LocalLauncher(Launcher):
    """Ranks as processes on this machine; `--nproc`/`--ranks-per-node` simulate nodes. With a `fabric:`
    section the simulated nodes talk over an emulated, shaped network (one per run)."""

    kind = "local"
    profile_type = LocalProfile
    job_type = LocalJob
    profile: LocalProfile

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        nproc = nproc or 1
        ranks_per_node = ranks_per_node or nproc
        local.check_layout(nproc, ranks_per_node)
        self._check_fabric()
        return Layout(nproc // ranks_per_node, ranks_per_node)

    def _check_fabric(self) -> None:
        """Refuse in one line, before anything starts, a fabric this machine cannot build."""
        if self.profile.fabric is not None:
            from abtune.launch.fabric import check_requirements

            check_requirements(loss=self.profile.fabric.loses_packets)

    def check_request(self, layout: Layout, config: RunConfig | None = None) -> str | None:
        """The fabric's faults and latency against the run (fabric.check_fabric)."""
        if self.profile.fabric is not None:
            from abtune.launch.fabric import check_fabric

            check_fabric(self.profile.fabric, layout.nodes, config.train.steps if config is not None else None)
        return None

    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        """A child process that starts the ranks; its logs go to RUN_DIR/jobs/."""
        executor = submitit.LocalExecutor(folder=run_dir / JOBS_DIR)
        executor.update_parameters(timeout_min=timeout_min, tasks_per_node=1, nodes=1)
        with exported(env), _stderr_to(run_dir / JOBS_DIR / CONTROLLER_ERRORS):
            job = executor.submit(run_local_job, str(run_dir), layout.world_size, layout.ranks_per_node, resume,
                                  self.profile.fabric)
        return LocalJob(job, run_dir)

    def run(self, run_dir: Path, layout: Layout, *, resume: bool = False, out: TextIO = sys.stdout) -> RunOutcome:
        """The ranks are this process's children: Ctrl-C reaches them, and no controller sits between."""
        return run_local_ranks(str(run_dir), layout.world_size, layout.ranks_per_node, resume, self.profile.fabric)


CONTROLLER_ERRORS = "controller.err"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """This process's stderr goes to `path` while submitit starts a job's controller, which inherits it.
    The controller writes only when it is stopped (a KeyboardInterrupt traceback on every cancel and
    every Ctrl-C of a terminal) or breaks: that belongs with the job's logs, not in the user's output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as errors:
            os.dup2(errors.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# --- one rank in this process ----------------------------------------------------------------------
def run_in_process(run_dir: str, resume: bool) -> RunOutcome:
    """The body of a debug job: rank 0 of 1 in this very process (breakpoints work; crashes open pdb)."""
    from abtune.training.worker import run_rank

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", **{jobenv.NODE_RANK: "0"},
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    try:
        run_rank(Path(run_dir), resume)
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


class DebugJob(Job):
    """Runs when first polled, in this process (submitit's DebugExecutor)."""

    kind = "debug"
    label = "debug job"

    def __init__(self, job: submitit.Job[RunOutcome], run_dir: Path, env: dict[str, str] | None) -> None:
        super().__init__(str(job.job_id), run_dir)
        self._job, self._env = job, env

    def poll(self) -> RunOutcome | None:
        with exported(self._env):
            return _result(self._job)

    def cancel(self) -> None:
        self._job.cancel()


class DebugLauncher(Launcher):
    """One rank inside the `abtune` process itself, so breakpoints and debuggers work."""

    kind = "debug"
    profile_type = DebugProfile
    job_type = DebugJob
    runs_studies = False

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        if nproc is not None or ranks_per_node is not None:
            raise ConfigError("--nproc and --ranks-per-node are for --launcher local; debug runs one rank")
        return Layout(1, 1)

    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        executor = submitit.DebugExecutor(folder=run_dir / JOBS_DIR)
        return DebugJob(executor.submit(run_in_process, str(run_dir), resume), run_dir, env)


# The registry: the launchers abtune knows, by profile kind. Adding a launcher is its module and one entry here;
# load_launcher, parse_profile, reattach, `study launch|stop|status` and the tests read this table only.
LAUNCHER_TYPES: tuple[type[Launcher], ...] = (LocalLauncher, DebugLauncher, SlurmLauncher, GridEngineLauncher)
LAUNCHERS: dict[str, type[Launcher]] = {launcher.kind: launcher for launcher in LAUNCHER_TYPES}
# the job kinds another process can follow (re-attach); a debug job lives and dies with its process
JOB_KINDS = tuple(kind for kind, launcher in LAUNCHERS.items() if launcher.job_type.followable)


def study_launcher_kinds() -> list[str]:
    """The kinds of profile that study trials run on."""
    return [kind for kind, launcher in LAUNCHERS.items() if launcher.runs_studies]


def launcher_type(kind: str) -> type[Launcher]:
    """The launcher class of a job or profile kind (KeyError for none abtune knows)."""
    return LAUNCHERS[kind]


def reattach(kind: str, record: Any, run_dir: Path) -> Job | None:
    """The job another process submitted, to follow from here; None when it cannot be (a local job on
    another host, or one that is gone without a result)."""
    launcher = LAUNCHERS.get(kind)
    return launcher.job_type.reattach(record, run_dir) if launcher is not None else None


# --- a job as a study trial records it: {kind, record, run_id} ------------------------------------
JobEntry = dict[str, Any]


def job_entry(job: Job, run_id: str | None) -> JobEntry | None:
    """What a trial stores of its job for another process to follow (`followed`); None for a job that
    ends with the process that started it."""
    return {"kind": job.kind, "record": job.record(), "run_id": run_id} if job.followable else None


def recorded_job(attrs: Mapping[str, Any]) -> JobEntry | None:
    """A trial's job entry (JOB_ATTR); from a study written by an earlier version, its launcher's own attribute."""
    if attrs.get(JOB_ATTR):
        return attrs[JOB_ATTR]
    for kind, launcher in LAUNCHERS.items():
        legacy = launcher.job_type.legacy_attr
        if legacy is not None and attrs.get(legacy):
            return {"kind": kind, "record": attrs[legacy], "run_id": attrs.get(RUN_ID_ATTR)}
    return None


def followed(entry: JobEntry, run_dir: Path) -> Job | None:
    """The recorded job, to follow from here (`reattach`)."""
    return reattach(entry["kind"], entry["record"], run_dir)


def job_id(entry: JobEntry) -> str:
    return LAUNCHERS[entry["kind"]].job_type.id_of(entry["record"])


def describe_job(entry: JobEntry) -> str:
    """`SLURM job 812`, `local job 4711`: as `Job.describe()` names the recorded job, without following it."""
    return f"{LAUNCHERS[entry['kind']].job_type.label} {job_id(entry)}"


def rerun_args(entry: JobEntry | None, source: str | None, nproc: int, ranks_per_node: int) -> list[str]:
    """`abtune train` options that run a trial again where it ran (its job's launcher; without a recorded
    job, local processes)."""
    launcher = LAUNCHERS[entry["kind"]] if entry is not None else LAUNCHERS[DEFAULT_LAUNCHER]
    return launcher.rerun_args(source, nproc, ranks_per_node)


# --- capabilities: queues and study workers -------------------------------------------------------
def job_queue(launcher: type[Launcher]) -> type[JobQueue] | None:
    """The launcher as a queue of jobs asked about by id; None for one whose jobs sit in no queue."""
    return launcher if issubclass(launcher, JobQueue) else None


def worker_launchers() -> list[str]:
    """The kinds of launcher that can submit study workers (`study launch`)."""
    return [kind for kind, launcher in LAUNCHERS.items() if issubclass(launcher, StudyWorkers)]


def study_workers(launcher: Launcher, study: str = "NAME") -> StudyWorkers:
    """The launcher as one that submits study workers; else why `study launch` cannot use it, and what works."""
    if isinstance(launcher, StudyWorkers):
        return launcher
    raise ConfigError(f"--launcher {launcher.source or launcher.kind}: `study launch` submits study workers that run "
                      f"on after it returns, which {launcher.kind} jobs do not; use a "
                      f"{' or '.join(worker_launchers())} profile, or run the study here with `abtune study run {study}`")


def this_worker_job() -> dict[str, str]:
    """The job this process runs in, as a study worker stamps its trials with it ({} outside one)."""
    for launcher in LAUNCHERS.values():
        if issubclass(launcher, StudyWorkers) and (found := launcher.job_environment()):
            return {launcher.worker_key: found}
    return {}


def worker_job(worker: Mapping[str, Any]) -> tuple[type[StudyWorkers], str] | None:
    """The launcher and id of the job a stamped worker runs in; None for a worker outside one."""
    for launcher in LAUNCHERS.values():
        if issubclass(launcher, StudyWorkers) and worker.get(launcher.worker_key):
            return launcher, str(worker[launcher.worker_key])
    return None


def worker_launcher_type(kind: str | None) -> type[Launcher]:
    """The launcher of a study's launched workers; studies launched before the kind was recorded: the first
    launcher that launches workers."""
    if kind is not None:
        return LAUNCHERS[kind]
    return LAUNCHERS[worker_launchers()[0]]


def _result(job: submitit.Job[RunOutcome]) -> RunOutcome:
    try:
        return job.result()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as error:
        # the job's own process died (killed, timeout): its body could not report
        return RunOutcome(False, f"job {job.job_id} ended abnormally: {_last_line(str(error))}", 1)


def _without_result(job_id: str, run_dir: Path, paths: submitit.core.utils.JobPaths) -> RunOutcome:
    """A job that wrote no result was cancelled or killed, or could not write it: its file system is full."""
    full = disk_full(run_dir, [paths.stderr, paths.stdout])
    if full:
        return RunOutcome(False, f"local job {job_id} failed: {full}", 1)
    return RunOutcome(False, f"local job {job_id} ended without a result (cancelled or killed)", 1)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return lines[-1] if lines else "no message"
