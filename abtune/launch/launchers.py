"""The launchers abtune ships: local processes (optionally on an emulated fabric), one in-process
debug rank, and SLURM jobs through submitit. `load_launcher(NAME|PATH)` builds one from its profile.

The helpers they stand on sit beside this module: local.py starts ranks as processes, warm.py forks
them from a warm server, fabric.py emulates an interconnect, slurm.py writes and follows SLURM jobs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import submitit

from abtune.attrs import JOB_ATTR, RUN_ID_ATTR
from abtune.config import RunConfig
from abtune.errors import AbtuneError, ConfigError
from abtune.launch import local, slurm
from abtune.launch.base import (
    DEFAULT_LAUNCHER,
    DEFAULT_TIMEOUT_MIN,
    Job,
    Launcher,
    Layout,
    SubmissionFailed,
    exported,
)
from abtune.launch.gridengine.launcher import GridEngineLauncher
from abtune.launch.outcome import RunOutcome, disk_full
from abtune.launch.pids import process_alive, process_start
from abtune.launch.profiles import (
    FabricProfile,
    LocalProfile,
    Profile,
    SlurmProfile,
    load_profile,
)

JOBS_DIR = slurm.JOBS_DIR


def load_launcher(name_or_path: str) -> Launcher:
    """The launcher of a profile: `--launcher NAME|PATH` (see profiles.resolve_profile_path)."""
    launcher = launcher_for(load_profile(name_or_path))
    launcher.source = name_or_path
    return launcher


def launcher_for(profile: Profile) -> Launcher:
    return LAUNCHERS[profile.kind](profile)


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

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", ABTUNE_NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(local.free_port()))
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


# --- SLURM -----------------------------------------------------------------------------------------
class SlurmJob(Job):
    """A SLURM job of the run's ranks; it keeps running when abtune stops following it."""

    kind = "slurm"
    label = "SLURM job"
    outlives_driver = True
    followable = True
    legacy_attr = "slurm_job_id"

    def __init__(self, job: submitit.Job[RunOutcome], run_dir: Path) -> None:
        super().__init__(str(job.job_id), run_dir)
        self.submitit_job = job
        slurm.QUEUE.follow(self.job_id)  # asked about in the same squeue call as every other job followed

    @classmethod
    def reattach(cls, record: Any, run_dir: Path) -> SlurmJob:
        """Any SLURM job can be followed from any host of the cluster: sacct knows it."""
        return cls(slurm.attach(str(record), slurm.job_folder(run_dir)), run_dir)

    def poll(self) -> RunOutcome | None:
        return slurm.outcome(self.submitit_job, self.run_dir)

    def cancel(self) -> None:
        self.submitit_job.cancel(check=False)

    def gone(self) -> bool:
        """Out of squeue: sacct may call a cancelled job CANCELLED while its tasks are still ending."""
        return not slurm.in_queue(self.job_id)

    @property
    def state(self) -> str:
        return slurm.state(self.submitit_job)

    def watch_command(self) -> str:
        return f"squeue -j {self.job_id}"

    def cancel_command(self) -> str:
        return f"scancel {self.job_id}"

    def follow(self, out: TextIO = sys.stdout, poll_s: float = slurm.POLL_SECONDS) -> RunOutcome:
        from abtune.launch.follow import follow

        return follow(self, out, poll_s)


class SlurmLauncher(Launcher):
    """One SLURM job of `nodes x tasks_per_node` tasks per run (the profile's layout); every task is one rank."""

    kind = "slurm"
    job_type = SlurmJob
    jobs_outlive_driver = True
    launches_workers = True
    worker_key = "slurm_job"
    profile: SlurmProfile

    def __init__(self, profile: SlurmProfile) -> None:
        super().__init__(profile)
        self.poll_s = slurm.poll_interval(profile)  # one squeue per poll for all jobs (slurm.QueueView)

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        if nproc is not None or ranks_per_node is not None:
            raise ConfigError("--nproc and --ranks-per-node are for --launcher local; "
                              "set nodes and tasks_per_node in the profile")
        return Layout(self.profile.nodes, self.profile.tasks_per_node)

    def trial_layout(self, nproc: int, ranks_per_node: int, measures_inter_node: bool) -> Layout:
        """The profile wins over the study's `layout` (which is for local runs)."""
        if measures_inter_node and self.profile.nodes < 2:
            raise ConfigError("launcher profile: nodes is 1, but this study measures inter-node traffic; "
                              "use a profile with nodes >= 2")
        return self.layout(None, None)

    def resized(self, layout: Layout) -> SlurmLauncher:
        return SlurmLauncher(self.profile.model_copy(update={"nodes": layout.nodes,
                                                             "tasks_per_node": layout.ranks_per_node}))

    def batch_script(self, run_dir: Path, layout: Layout, job_name: str | None = None) -> str:
        return slurm.sbatch_script(run_dir, layout, self.profile, job_name)

    def check_request(self, layout: Layout, config: RunConfig | None = None) -> str | None:
        """What sinfo tells of the partition: a job it can never hold is refused (capacity.check_request)."""
        from abtune.launch.capacity import check_request

        return check_request(self.profile, layout)

    def submit(self, run_dir: Path, layout: Layout, *, resume: bool = False, job_name: str | None = None,
               timeout_min: int = DEFAULT_TIMEOUT_MIN, env: dict[str, str] | None = None) -> Job:
        """sbatch (the profile's time limit, not `timeout_min`); from inside a job as from a login node. A
        job the cluster can never start is refused as sbatch refuses one (SubmissionFailed)."""
        try:
            self.check_request(layout)
        except ConfigError as error:
            raise SubmissionFailed(str(error)) from None
        with slurm.nested_submission(), exported(env):
            return SlurmJob(slurm.submit(run_dir, layout, self.profile, resume, job_name), run_dir)

    def after(self, job: Job, body: Callable[[], Any], folder: Path) -> Job:
        """A light one-task job that starts when `job` leaves the queue (sbatch --dependency=afterany)."""
        with slurm.nested_submission():
            return SlurmJob(slurm.submit_after(job.job_id, folder, self.profile, body, f"{_job_name(job)}-after"),
                            job.run_dir)

    # --- study workers: one job array of light jobs (see abtune/study/launch.py) ---------------
    def submit_workers(self, folder: Path, body: Callable[[], Any], count: int, job_name: str) -> list[str]:
        jobs = slurm.submit_array(folder, slurm.WORKER_LAYOUT, slurm.worker_profile(self.profile), [body] * count,
                                  job_name)
        return [job.job_id for job in jobs]

    def workers_script(self, folder: Path, count: int, job_name: str) -> str:
        return f"# {count} worker(s): one job array, 1 task each\n" + slurm.array_script(folder, slurm.WORKER_LAYOUT, slurm.worker_profile(self.profile), count, job_name)

    def check_worker_room(self, layout: Layout, count: int, rerun: str) -> str | None:
        """Workers sit on the cluster's nodes as long as they run: refuse a layout where they can hold
        every node a trial needs (capacity.py). Array tasks beyond `array_parallelism` wait, holding nothing."""
        from abtune.launch.capacity import check_workers_leave_room

        return check_workers_leave_room(self.profile, slurm.worker_profile(self.profile), layout,
                                        min(count, self.profile.array_parallelism), rerun)

    def watch_workers_command(self, job_name: str) -> str:
        return f"squeue --name {job_name}"

    @classmethod
    def job_environment(cls) -> str | None:
        """The SLURM job this process runs in, as squeue shows it (`ARRAY_TASK` for an array task)."""
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")

    @classmethod
    def rerun_args(cls, source: str | None, nproc: int, ranks_per_node: int) -> list[str]:
        """The profile sets nodes and tasks."""
        return ["--launcher", source or cls.kind]

    @classmethod
    def queued(cls, job_ids: Sequence[str]) -> list[str]:
        from abtune.launch.capacity import queued

        return queued(job_ids)

    @classmethod
    def cancel(cls, job_ids: Sequence[str]) -> None:
        from abtune.launch.capacity import slurm_output

        if job_ids:  # a job that ended meanwhile makes scancel complain; callers check the queue afterwards
            slurm_output("scancel", *job_ids)

    @classmethod
    def waiting_notes(cls, trial_jobs: dict[int, str], worker_jobs: Sequence[str]) -> dict[int, str]:
        from abtune.launch.capacity import trial_job_notes

        return trial_job_notes(trial_jobs, worker_jobs)


def _job_name(job: Job) -> str:
    return f"abtune-{job.run_dir.absolute().name}"


# The launchers abtune knows, by profile kind: what load_launcher builds, re-attach follows and the tests cover.
LAUNCHERS: dict[str, type[Launcher]] = {launcher.kind: launcher
                                        for launcher in (LocalLauncher, DebugLauncher, SlurmLauncher,
                                                         GridEngineLauncher)}
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


# --- study workers: the job a worker runs in, as it stamps its trials ----------------------------
def this_worker_job() -> dict[str, str]:
    """The job this process runs in, as a study worker stamps its trials with it ({} outside one)."""
    for launcher in LAUNCHERS.values():
        if launcher.worker_key is not None and (found := launcher.job_environment()):
            return {launcher.worker_key: found}
    return {}


def worker_job(worker: Mapping[str, Any]) -> tuple[type[Launcher], str] | None:
    """The launcher and id of the job a stamped worker runs in; None for a worker outside one."""
    for launcher in LAUNCHERS.values():
        if launcher.worker_key is not None and worker.get(launcher.worker_key):
            return launcher, str(worker[launcher.worker_key])
    return None


def worker_launcher_type(kind: str | None) -> type[Launcher]:
    """The launcher of a study's launched workers; studies launched before the kind was recorded: the one
    launcher that launches workers."""
    if kind is not None:
        return LAUNCHERS[kind]
    return next(launcher for launcher in LAUNCHERS.values() if launcher.launches_workers)


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
