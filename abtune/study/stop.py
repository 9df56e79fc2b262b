"""`abtune study stop NAME`: workers first, then the trial jobs; no trial left RUNNING unfollowed.

The stop request is written into the study (`abtune:stop`), where every worker looks before it asks
for a trial: a worker that sees it asks for nothing more, wherever it runs (any host, any launcher).
Then:

- a `study launch` worker array (its job ids are recorded in the study at launch) is cancelled, and
  the command waits until its jobs have left the queue, so no worker sees its trial's job cancelled
  and answers by asking a new trial (scancel of the array alone raced like that);
- a local `study run` stops as on Ctrl-C: it cancels its trial jobs and re-enqueues their trials
  (fails them with --fail); with --let-trials-finish it follows its running trials to their end;
- the RUNNING trials no live worker follows any more are cancelled (SLURM job, or local job on this
  host) and re-enqueued, or failed with --fail; with --let-trials-finish their jobs keep running and
  the next `abtune study run` re-attaches them and tells their results.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import (
    FAIL_REASON_ATTR,
    RETRY_OF_ATTR,
    RUN_DIR_ATTR,
    RUN_ID_ATTR,
    SEED_JOBS_ATTR,
    STOP_ATTR,
    WORKER_JOBS_ATTR,
    WORKER_KIND_ATTR,
    stored,
)
from abtune.launch.base import Job, Launcher
from abtune.launch.launchers import job_queue, worker_job, worker_launcher_type
from abtune.runfiles import summary_path
from abtune.study import reattach, retries, workers
from abtune.study.optuna_private import trial_id
from abtune.study.repeats import seed_dir
from abtune.study.spec import StudySpec
from abtune.tracking import Tracking

REQUEUE, FAIL, LET_FINISH = "requeue", "fail", "let-trials-finish"
STOPPED = "stopped by `abtune study stop`"
WAIT_S = 120.0  # a local runner's cancel grace (30 s) and a worker job's way out of the queue
POLL_S = 1.0


class StopWatch:
    """A worker's view of stop requests: only a request made after the worker started counts (the
    request stays in the study; the next `study run` or `study launch` is not stopped by it)."""

    def __init__(self, storage: BaseStorage, study_id: int) -> None:
        self.storage, self.study_id = storage, study_id
        earlier = self._request()
        self.ignored = earlier["id"] if earlier else None
        self.mode: str | None = None

    def _request(self) -> dict[str, Any] | None:
        return stored(self.storage.get_study_system_attrs(self.study_id), STOP_ATTR)

    def new_request(self) -> str | None:
        """The mode of a stop request not yet seen, once; None otherwise."""
        if self.mode is not None:
            return None
        request = self._request()
        if request is None or request["id"] == self.ignored:
            return None
        self.mode = request["mode"]
        return self.mode

    def interrupted_as(self, reason: str, kind: str | None) -> tuple[str, str | None]:
        """How a trial this worker cancelled ends: as stopped (and not retried with --fail) when a stop asked it."""
        if kind != retries.INTERRUPTED or self.mode not in (REQUEUE, FAIL):
            return reason, kind
        return STOPPED, (None if self.mode == FAIL else kind)


def request_stop(storage: BaseStorage, study_id: int, mode: str) -> None:
    storage.set_study_system_attr(study_id, STOP_ATTR, {"id": uuid.uuid4().hex, "mode": mode, "at": time.time()})


def record_worker_jobs(storage: BaseStorage, study_id: int, kind: str, job_ids: list[str]) -> None:
    """`study launch`: the workers' jobs and their launcher's kind, for `study stop` to cancel."""
    known = worker_jobs(storage, study_id)
    storage.set_study_system_attr(study_id, WORKER_JOBS_ATTR, [*known, *job_ids])
    storage.set_study_system_attr(study_id, WORKER_KIND_ATTR, kind)


def worker_launcher(storage: BaseStorage, study_id: int) -> type[Launcher]:
    """The launcher type of the study's launched workers."""
    return worker_launcher_type(stored(storage.get_study_system_attrs(study_id), WORKER_KIND_ATTR))


def worker_jobs(storage: BaseStorage, study_id: int) -> list[str]:
    """The job ids of the study's launched workers (`study launch`), every launch's."""
    return list(stored(storage.get_study_system_attrs(study_id), WORKER_JOBS_ATTR, []))


def follower_alive(trial: FrozenTrial, stale_after_s: float) -> bool:
    launched = worker_job(workers.owner_of(trial) or {})
    if launched is not None:  # a launched worker: alive while its job is queued
        launcher, job_id = launched
        return bool(launcher.queued([job_id]))
    return not workers.is_stale(trial, stale_after_s)


def stop_study(storage: BaseStorage, name: str, spec: StudySpec, mode: str,
               say: Callable[[str], None], wait_s: float = WAIT_S, tracking: Tracking | None = None) -> None:
    """Stop every worker of the study, then deal with its RUNNING trials as `mode` says; `say` each step.
    `tracking`: the store of the trials' MLflow runs; those of trials the stop ends itself are closed
    there (a live worker closes its own)."""
    study_id = storage.get_study_id_from_name(name)
    request_stop(storage, study_id, mode)
    say(f"study {name}: asked its workers to start no new trial")
    queue = job_queue(worker_launcher(storage, study_id))
    queued = queue.queued(worker_jobs(storage, study_id)) if queue is not None else []
    if queue is not None and queued:
        queue.cancel(queued)  # a job that ended meanwhile is no error: the queue is asked again below
        say(f"cancelled worker job(s) {' '.join(queued)}")

    def running() -> list[FrozenTrial]:
        return storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))

    def busy() -> bool:  # local runners cancelling their trials; worker jobs leaving the queue
        followed = mode != LET_FINISH and any(follower_alive(t, spec.retries.stale_after_s) for t in running())
        return followed or bool(queue is not None and queue.queued(queued))

    was_running = {t.number: trial_id(t) for t in running()}
    _wait_until(lambda: not busy(), wait_s)
    study = optuna.load_study(study_name=name, storage=storage)
    left = running()
    followed = {t.number for t in left if follower_alive(t, spec.retries.stale_after_s)}  # read once: squeue
    jobs = _cancel_unfollowed([t for t in left if t.number not in followed], mode)
    for trial in left:
        say(_stop_trial(study, trial, mode, tracking or Tracking(), trial.number in followed, jobs.get(trial.number)))
    still = {t.number for t in left}
    for number, stored_id in sorted(was_running.items()):
        if number not in still:
            say(_fate(storage, study_id, storage.get_trial(stored_id)))
    if not was_running and not left:
        say("no trial is running")
    if mode != LET_FINISH and tracking is not None and not running():
        tracking.close_study_parent_run(name, "KILLED")  # a dead runner left it open; a live one closed it


def _fate(storage: BaseStorage, study_id: int, trial: FrozenTrial) -> str:
    """What became of a trial its own worker stopped (or that ended) while the stop waited."""
    if trial.state != TrialState.FAIL:
        return f"trial {trial.number}: finished meanwhile ({trial.state.name})"
    reason = trial.user_attrs.get(FAIL_REASON_ATTR, "failed")
    retry = next((t.number for t in storage.get_all_trials(study_id, deepcopy=False)
                  if t.user_attrs.get(RETRY_OF_ATTR) == trial.number), None)
    again = f", re-enqueued as trial {retry}" if retry is not None else ""
    return f"trial {trial.number}: its worker stopped it ({reason}): failed{again}"


def _cancel_unfollowed(unfollowed: list[FrozenTrial], mode: str) -> dict[int, Job]:
    """The jobs of the trials no live worker follows, by trial number, cancelled all at once and waited for
    together until they have ended (their ranks write nothing more): one wait for all, not one per trial."""
    if mode == LET_FINISH:
        return {}
    jobs = {t.number: job for t in unfollowed if (job := _job_of(t)) is not None}
    for job in jobs.values():
        job.cancel()
    _wait_until(lambda: all(job.gone() for job in jobs.values()), WAIT_S)
    return jobs


def _stop_trial(study: optuna.Study, trial: FrozenTrial, mode: str, tracking: Tracking, followed: bool,
                cancelled: Job | None) -> str:
    """`followed`: a live worker follows the trial; `cancelled`: the trial's job, which _cancel_unfollowed
    cancelled (None: it had none, or it is followed)."""
    owner = workers.owner_of(trial)
    if followed:
        verb = "follows it to its end" if mode == LET_FINISH else "did not stop in time; it still follows it"
        return f"trial {trial.number}: its worker {workers.describe(owner)} {verb}"
    if mode == LET_FINISH:
        job = _job_of(trial)
        if job is None:
            return f"trial {trial.number}: no job left; the next `abtune study run` fails it as stale"
        return f"trial {trial.number}: {job.describe()} keeps running; the next `abtune study run` re-attaches it"
    job = cancelled
    retry = None if mode == FAIL else retries.INTERRUPTED
    if not retries.fail_unfollowed(study, trial, STOPPED, retry):
        return f"trial {trial.number}: finished meanwhile"
    # as a worker ends the runs of the trials it stops: killed when the trial runs again, else failed
    status = "FAILED" if retry is None else "KILLED"
    tracking.finish_run(trial.user_attrs.get(RUN_ID_ATTR), None, status)
    run_dir = trial.user_attrs.get(RUN_DIR_ATTR)
    for seed, entry in trial.user_attrs.get(SEED_JOBS_ATTR, {}).items():  # a repeated trial's child runs
        finished = run_dir is not None and summary_path(seed_dir(Path(run_dir), int(seed))).exists()
        tracking.finish_run(entry.get("run_id"), None, "FINISHED" if finished else status)
    what = f"{job.describe()} cancelled, " if job else ""
    return f"trial {trial.number}: {what}" + ("failed" if retry is None else "failed and re-enqueued")


def _job_of(trial: FrozenTrial) -> Job | None:
    """The trial's job while it still runs (SLURM: any host; local: this host)."""
    job = reattach.job_to_follow(trial)
    return job if job is not None and not job.gone() else None


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(POLL_S)
