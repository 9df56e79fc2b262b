"""`abtune study run`: ask -> prepare the run folder -> submit -> tell, P trials at a time.

One runner is one worker process. Several workers (on one host or many, sharing a storage) can
run the same study; the budget counts every trial in the storage. A worker:

1. re-attaches the RUNNING trials of dead workers whose job still runs or left its result (a SLURM
   job; a local job on this host, see reattach.py), and fails and re-enqueues the others, within
   `retries`;
2. starts trials while fewer than P run and the budget allows (waiting trials first: the
   reference trials and retries);
3. tells each finished trial: COMPLETE with its objectives, PRUNED when its run stopped early,
   FAIL with `fail_reason` when it failed (the study goes on);
4. on Ctrl-C cancels its jobs and re-enqueues their trials: none is left RUNNING.

Launchers (abtune/launch/base.py): locally (the default) a trial is `layout.nproc` processes as the
study file says; with a SLURM profile, one SLURM job of `nodes x tasks_per_node` ranks (the profile
wins; the study's `layout` is for local runs). Every trial's job is recorded in the trial (reattach.py).
On Ctrl-C a launcher whose jobs outlive this process (SLURM) is only stopped following: the jobs keep
running, their trials stay RUNNING, and the next worker re-attaches them instead of failing them as
stale. A cancelled or failed job makes its trial FAIL with the launcher's reason (`SLURM job 812
CANCELLED`). Each trial's run goes through the one run lifecycle (abtune/runs.py).
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import (
    ARTIFACTS_AT_ATTR,
    ARTIFACTS_COST_ATTR,
    FAIL_REASON_ATTR,
    HEARTBEAT_ATTR,
    OVER_BUDGET_ATTR,
    REFERENCE_ATTR,
    RETRIED_ATTR,
    RETRY_OF_ATTR,
    RUN_DIR_ATTR,
    RUN_ID_ATTR,
    SEEDS_ATTR,
    TRAFFIC_EXCESS_ATTR,
    WORKER_ATTR,
    stored,
)
from abtune.config import RunConfig, parse_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.launch.base import Job, Launcher, SubmissionFailed
from abtune.launch.launchers import default_launcher
from abtune.launch.outcome import RunOutcome, is_disk_full
from abtune.launch.profiles import check_fits
from abtune.redact import redact
from abtune.rundir import UnwritableFolder, check_writable
from abtune.runfiles import CONFIG_FILE
from abtune.runs import FAILED, FINISHED, KILLED, Run
from abtune.study import (
    dashboard_notes,
    importance,
    parent_run,
    reattach,
    recommendation,
    repeats,
    results,
    retries,
    stop,
    workers,
)
from abtune.study.definition import open_search_study, stored_study_dir
from abtune.study.live_view import RunDisplay
from abtune.study.optuna_private import trial_id
from abtune.study.space import build_distributions
from abtune.study.storage import absolute_url, storage_environment
from abtune.study.trials import (
    adopt_retried_checkpoint,
    record_launcher,
    submit_trial,
    trial_config,
    trial_dir,
    trial_hook_specs,
    trial_job_name,
    trial_layout,
)
from abtune.tracking import LaunchInfo, Tracking

POLL_S = 0.5
HEARTBEAT_S = 10.0
CANCEL_GRACE_S = 30.0
# The study plots and importances are rebuilt from every trial (seconds of CPU, growing with the study):
# at most this often for the whole study while trials end, and never more than this share of the time
# (claim_study_artifacts).
STUDY_ARTIFACTS_EVERY_S = 60.0
STUDY_ARTIFACTS_SHARE = 0.1
INTERRUPTED = "interrupted by the user (Ctrl-C)"


def claim_study_artifacts(storage: BaseStorage, study_id: int, ended_at: float | None = None,
                          every_s: float = STUDY_ARTIFACTS_EVERY_S) -> bool:
    """Whether this runner should rebuild the study's plots and importances now; if so, the study records it.

    Their cost grows with the trials (the evaluation curves draw a line per trial), so however many workers
    a study has, it rebuilds them once per `every_s`, and at a runner's end (`ended_at`: when its last
    trial ended) only if nobody rebuilt them since; otherwise workers of a large study spend their time
    drawing. The interval grows to keep rebuilds under STUDY_ARTIFACTS_SHARE of the time: after a rebuild
    that took 6 s the next waits 60 s, after one of 60 s, 10 minutes. Two workers that claim at once both
    rebuild: harmless, the same plots."""
    attrs = storage.get_study_system_attrs(study_id)
    last = float(stored(attrs, ARTIFACTS_AT_ATTR, 0.0))
    every_s = max(every_s, float(stored(attrs, ARTIFACTS_COST_ATTR, 0.0)) / STUDY_ARTIFACTS_SHARE)
    now = time.time()
    if ended_at is None and now - last < every_s:
        return False
    if ended_at is not None and last > 0 and last >= ended_at:
        return False
    storage.set_study_system_attr(study_id, ARTIFACTS_AT_ATTR, now)
    return True


@dataclass
class Active:
    """A trial this runner follows: its run (for repeats, the trial folder whose job is its seeds')."""

    trial: optuna.Trial
    run: Run | None = None
    started: float = field(default_factory=time.time)

    @property
    def job(self) -> Job | None:
        return None if self.run is None else self.run.job

    @property
    def run_dir(self) -> Path | None:
        return None if self.run is None else self.run.run_dir

    @property
    def mlflow_run_id(self) -> str | None:
        return self.trial.user_attrs.get(RUN_ID_ATTR)  # set by Tracking.start_trial_run; survives re-attaching


class StudyRunner:
    def __init__(self, storage: BaseStorage, name: str, url: str, parallel: int, max_trials: int | None,
                 launcher: Launcher | None = None, tracking: Tracking | None = None) -> None:
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(name)
        self.study, self.spec = open_search_study(storage, name)
        self.study_dir = stored_study_dir(storage, self.study_id)
        check_writable(self.study_dir, "study_dir")  # before any trial is asked for: none is left RUNNING
        self.distributions = build_distributions(self.spec, f"study {name}")
        self.launcher = launcher or default_launcher()
        self.layout = trial_layout(self.spec, self.launcher)
        base = parse_run_config(self.spec.base, f"study {name}: base")
        check_fits(base, self.layout)
        self.launcher.check_request(self.layout, base)  # a trial the launcher can never start: refused before any ask
        self.error: AbtuneError | None = None
        self.left_running: list[Job] = []  # jobs (SLURM) still running when this runner stopped
        self.parallel = parallel
        self.max_trials = max_trials
        self.worker = workers.this_worker()
        self.stop_watch = stop.StopWatch(storage, self.study_id)
        self.active: list[Active] = []
        self.started = 0
        self.stopping = False
        self._last_beat = self._last_scan = 0.0
        self._artifacts_due = 0.0  # time.monotonic() from which trial ends rebuild the study's artifacts
        self._ended_at = 0.0  # time.time() when a trial of this runner last ended (its MLflow run closed)
        self._ended: list[tuple[Active, str]] = []  # trials whose MLflow runs are still to be closed
        self.display = RunDisplay(name, self.spec, parallel)
        self.trial_env = storage_environment(url)  # the pruning hook's storage; never in a file
        self.tracking = tracking or Tracking()
        self.parent_run = self.tracking.study_parent_run(name, redact(absolute_url(url)))
        self._describe_study(self.all_trials())

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> bool:
        """Run until the budget is spent; False when interrupted (trials re-enqueued)."""
        previous = signal.signal(signal.SIGINT, self._on_interrupt)
        try:
            with self.display:
                self.recover_stale()
                self._enqueue_lost_references()
                self.display.refresh(self.all_trials())
                while self._step():
                    time.sleep(self.launcher.poll_s)
                if self.stopping:
                    self._detach_surviving_jobs()
                    self._cancel_all()
        finally:
            signal.signal(signal.SIGINT, previous)
            self._close_ended_runs()
            self._update_study_artifacts(final=True)
            self.tracking.finish_run(self.parent_run, None, "KILLED" if self.stopping else "FINISHED")
        if self.parent_run is None:  # tracking off: no rebuild publishes the answer, the dashboard's note still shows it
            self._publish_answer()
        if self.error is not None:
            raise self.error
        return not self.stopping

    def _enqueue_lost_references(self) -> None:
        """A reference trial whose last attempt failed runs again (every comparison reads it), unless
        `study stop --fail` failed it."""
        for trial in retries.lost_references(self.all_trials()):
            if trial.user_attrs.get(FAIL_REASON_ATTR) == stop.STOPPED:
                continue
            retries.enqueue(self.study, trial, retries.FAILED)
            self.display.note(f"trial {trial.number} ({results.label(trial)}) failed: enqueued again, "
                              "every comparison reads it")

    def _update_study_artifacts(self, final: bool = False) -> None:
        """The study's plots and importances rebuilt from every trial and its answer published with them, when this
        runner claims the rebuild. A final one it does not claim was claimed by another worker after this one's
        last trial ended: that worker's rebuild reads the trial and publishes the answer."""
        if self.parent_run is None:  # tracking off: no run to put the plots on, nothing to compute
            return
        self._artifacts_due = time.monotonic() + STUDY_ARTIFACTS_EVERY_S
        if not claim_study_artifacts(self.storage, self.study_id, ended_at=self._ended_at if final else None):
            return
        started = time.monotonic()
        trials = self.all_trials()
        analysis = importance.study_analysis(self.storage, self.study_id, trials, list(self.spec.space),
                                             importance.shown_objectives(self.spec), keep=True)
        answer = recommendation.current(self.study)
        # No plot rings a trial the study does not recommend (none finished, or none within DDP's margin)
        self.tracking.update_study_artifacts(self.parent_run, trials, self.study.metric_names, analysis,
                                             recommended=None if answer is None else answer.promoted)
        self._describe_study(trials)
        recommendation.publish(self.study, answer, self.tracking, self.parent_run)
        self.storage.set_study_system_attr(self.study_id, ARTIFACTS_COST_ATTR, time.monotonic() - started)

    def _describe_study(self, trials: list[FrozenTrial]) -> None:
        if self.parent_run is not None:
            self.tracking.describe_study(self.parent_run, parent_run.study_description(self.study.study_name, self.spec),
                                         parent_run.study_params(self.spec), parent_run.study_progress(trials),
                                         results.finished_count(trials))

    def _publish_answer(self) -> None:
        """The study's answer as the trials leave it now (decided again when they changed), on its MLflow run
        and optuna-dashboard note (study/recommendation.py)."""
        recommendation.publish(self.study, recommendation.current(self.study), self.tracking, self.parent_run)

    def _step(self) -> bool:
        for active in list(self.active):
            result = active.job.poll() if active.job is not None else None
            if result is not None:
                self.active.remove(active)
                try:
                    self._finish(active, result)
                except optuna.exceptions.UpdateFinishedTrialError:  # two workers re-attached the same job
                    self.display.note(f"trial {active.trial.number} was already finished by another worker")
        self.display.watch({a.trial.number: a.run_dir for a in self.active})
        self._obey_stop()
        while not self.stopping and len(self.active) < self.parallel and self._may_start():
            self._start()
        if self._close_ended_runs() and time.monotonic() >= self._artifacts_due:
            self._update_study_artifacts()
        self._keep_alive()
        return bool(self.active) and not self.stopping

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.stopping:
            raise KeyboardInterrupt
        self.stopping = True
        if self.launcher.jobs_outlive_driver:
            self.display.note(f"stopping: the trials' {self.launcher.kind} jobs keep running; "
                              "`abtune study run` re-attaches them")
        else:
            self.display.note("stopping: cancelling running trials (they are re-enqueued; Ctrl-C again to abort)")

    def _obey_stop(self) -> None:
        """`abtune study stop`: start nothing more; cancel the running trials (as Ctrl-C does), or with
        --let-trials-finish follow them to their end."""
        mode = self.stop_watch.new_request()
        if mode == stop.LET_FINISH:
            self.max_trials = self.started
            self.display.note(f"stop requested: no new trial; following {len(self.active)} running trial(s) to the end")
        elif mode is not None:
            self.stopping = True
            self.display.note("stop requested: stopping the running trials")

    def all_trials(self) -> list[FrozenTrial]:
        """Read at every start and end of a trial: through the study's cache, which reads only the trials that
        changed, not the storage's every trial."""
        return self.study.all_trials()

    def _may_start(self) -> bool:
        if self.max_trials is not None and self.started >= self.max_trials:
            return False
        trials = self.all_trials()
        return any(t.state == TrialState.WAITING for t in trials) or results.budget_used(trials) < self.spec.trials

    def _keep_alive(self) -> None:
        now = time.time()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            for active in self.active:
                # another worker may have found our heartbeat too old and failed the trial
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.storage.set_trial_system_attr(trial_id(active.trial), HEARTBEAT_ATTR, now)
        if now - self._last_scan >= self.spec.retries.stale_after_s / 2:
            self.recover_stale()

    # --- starting a trial ---------------------------------------------------------------------
    def _start(self) -> None:
        trial = self.study.ask()
        if self._over_budget(trial) or self._enqueued_twice(trial):
            return
        active = Active(trial)
        self.active.append(active)
        self.started += 1
        self._claim(trial_id(trial))
        try:
            config = trial_config(self.spec, self.study.study_name, self.distributions, trial, self.layout)
            run_id = self.tracking.start_trial_run(
                config, trial, study_name=self.study.study_name, parent_run_id=self.parent_run,
                launch_info=LaunchInfo(self.launcher.kind, self.layout.world_size, self.layout.ranks_per_node))
            if self.spec.repeats > 1:  # K seeds as one job (see repeats.py)
                active.run = repeats.start_trial(self, trial, config, run_id)
            else:
                active.run = self._submit(trial, config, run_id)
        except (SubmissionFailed, UnwritableFolder, OSError) as error:
            self.active.remove(active)
            self._refused(active, str(error))
            return
        except ConfigError as error:
            self.active.remove(active)
            self._fail(active, str(error), kind=None)
            return
        except BaseException as error:  # no trial left RUNNING without a job: it runs again, the runner stops
            self.active.remove(active)
            self._fail(active, f"not started: {type(error).__name__}: {error}", kind=retries.INTERRUPTED)
            raise
        assert active.job is not None
        reattach.record_job(trial, active.job, run_id)  # followed by the next runner if this one dies
        trial.set_user_attr("prepare_seconds", time.time() - active.started)  # ask -> submitted
        self.display.started(trial.number, trial.user_attrs.get(REFERENCE_ATTR))

    def _refused(self, active: Active, reason: str) -> None:
        """The cluster refused the trial's job or its folder (sbatch, a job that can never start, a folder
        that cannot be written, a full disk): every trial would meet the same, so the trial runs again later and the
        runner stops with the reason."""
        self._fail(active, reason, kind=retries.INTERRUPTED)
        self.error, self.stopping = ConfigError(reason), True

    def _over_budget(self, trial: optuna.Trial) -> bool:
        """Another worker took the last trial of the budget between our check and our ask: do not run
        this one (FAIL, not counted). Trial numbers are handed out in order, so of two workers asking
        at once only the later one steps back. Waiting trials (references, retries) always run."""
        frozen = self.storage.get_trial(trial_id(trial))
        if "fixed_params" in frozen.system_attrs or frozen.user_attrs.get(REFERENCE_ATTR):
            return False
        earlier = [t for t in self.all_trials() if t.number < trial.number]
        if results.budget_used(earlier) < self.spec.trials:
            return False
        trial.set_user_attr(OVER_BUDGET_ATTR, True)
        trial.set_user_attr(FAIL_REASON_ATTR, "not run: other workers took the last trials of the budget")
        self.study.tell(trial, state=TrialState.FAIL)
        self.display.note(f"trial {trial.number} not run: other workers took the last trials of the budget")
        return True

    def _enqueued_twice(self, trial: optuna.Trial) -> bool:
        """Two workers that started at once both enqueued a lost reference again (`_enqueue_lost_references`):
        only the earlier copy runs; this one is failed, never run, not counted."""
        retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
        if retry_of is None or not any(t.user_attrs.get(RETRY_OF_ATTR) == retry_of and t.number < trial.number
                                       for t in self.all_trials()):
            return False
        trial.set_user_attr(OVER_BUDGET_ATTR, True)
        trial.set_user_attr(FAIL_REASON_ATTR, f"not run: trial {retry_of} was enqueued again by another worker too")
        self.study.tell(trial, state=TrialState.FAIL)
        return True

    def _submit(self, trial: optuna.Trial, config: RunConfig, run_id: str | None) -> Run:
        run_dir = trial_dir(self.study_dir, trial.number)
        adopted = adopt_retried_checkpoint(self.study_dir, trial, run_dir)
        run = self.prepare_run(config, run_dir, trial_hook_specs(self.spec, self.study.study_name, trial), run_id,
                               continues_checkpoint=adopted)
        trial.set_user_attr(RUN_DIR_ATTR, str(run_dir))
        record_launcher(trial, self.launcher)
        submit_trial(run, self.spec, trial_job_name(self.study.study_name, trial.number), self.trial_env)
        return run

    def prepare_run(self, config: RunConfig, run_dir: Path, hooks: list[dict[str, Any]], run_id: str | None,
                    continues_checkpoint: bool = False) -> Run:
        """A trial's run (or a seed's) on this runner's launcher, recorded in tracking run `run_id`.
        `continues_checkpoint`: the folder holds a checkpoint (a retried trial's, or its own seed's when a
        repeated trial is re-attached), and training resumes it. A folder that already holds this run (a
        re-attached seed's) is continued, its config checked to be the same. The study's own `hooks:`
        follow `hooks` in every such run."""
        hooks = [*hooks, *(hook.model_dump() for hook in self.spec.hooks)]
        run = Run.prepare(config, run_dir, self.launcher, self.layout, resume=(run_dir / CONFIG_FILE).exists(),
                          hooks=hooks)
        run.resume = continues_checkpoint
        run.track(self.tracking, run_id)
        return run

    # --- finishing a trial --------------------------------------------------------------------
    def _finish(self, active: Active, outcome: RunOutcome) -> None:
        if self.stopping and not outcome.ok and not _outlives(active):  # our Ctrl-C stopped it
            self._fail(active, INTERRUPTED, kind=retries.INTERRUPTED)
            return
        if outcome.never_started or is_disk_full(outcome.reason):  # every trial would meet the same
            self._refused(active, outcome.reason or "its job could never start")
            return
        if not outcome.ok:
            reason = outcome.reason or f"the job exited with code {outcome.exit_code}"
            self._fail(active, reason, kind=retries.failure_kind(reason))
            return
        assert active.run_dir is not None
        attrs = repeats.trial_attrs(active.run_dir, active.trial.user_attrs.get(SEEDS_ATTR),
                                    time.time() - active.started)
        if isinstance(attrs, str):
            self._fail(active, attrs, kind=retries.FAILED)
            return
        budget = self.spec.constraints.max_inter_node_mb
        if budget is not None:
            attrs[TRAFFIC_EXCESS_ATTR] = attrs["inter_node_bytes"] / 1e6 - budget
        for key, value in attrs.items():
            active.trial.set_user_attr(key, value)
        try:
            dashboard_notes.annotate(active.trial, attrs)
        except Exception as error:  # noqa: BLE001 - a dashboard's note must not fail the trial it describes
            self.display.note(f"trial {active.trial.number}: no optuna-dashboard note ({error})")
        if budget is not None:  # feasible when <= 0; constrained samplers read it from the trial
            active.trial.set_constraint(TRAFFIC_EXCESS_ATTR, attrs[TRAFFIC_EXCESS_ATTR])
        self._end_tracking(active, FINISHED)
        if attrs["stopped_early"]:
            frozen = self.study.tell(active.trial, state=TrialState.PRUNED)
        else:
            frozen = self.study.tell(active.trial, [attrs[m] for m in self.spec.objectives])
        self.display.finished(frozen, self.all_trials())

    def _fail(self, active: Active, reason: str, kind: str | None) -> None:
        trial = active.trial
        reason, kind = self.stop_watch.interrupted_as(reason, kind)
        trial.set_user_attr(FAIL_REASON_ATTR, reason)
        self._end_tracking(active, KILLED if kind == retries.INTERRUPTED else FAILED)
        frozen = self.storage.get_trial(trial_id(trial))
        retry = retries.allowed(self.spec, frozen, kind)
        if retry:
            trial.set_user_attr(RETRIED_ATTR, True)
        frozen = self.study.tell(trial, state=TrialState.FAIL)
        if retry:
            retries.enqueue(self.study, frozen, kind)
        self.display.finished(frozen, self.all_trials())

    # --- other workers' dead trials, and stopping -----------------------------------------------
    def recover_stale(self) -> None:
        """Other workers' dead trials: a job that may still run, or ended with a result, is re-attached
        (SLURM: any host; local: this host); anything else failed."""
        self._last_scan = time.time()
        mine = {trial_id(a.trial) for a in self.active}
        for trial in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            if trial_id(trial) in mine:
                continue
            if workers.same_worker_job(trial, self.worker) or workers.is_stale(trial, self.spec.retries.stale_after_s):
                if repeats.is_repeated(trial):
                    self._reattach_seeds(trial)
                    continue
                job = reattach.job_to_follow(trial)
                if job is not None:
                    self._reattach(trial, job)
                    continue
                note = retries.fail_stale(self.study, self.spec, trial)
                if note:
                    self.display.note(note)

    def _reattach(self, frozen: FrozenTrial, job: Job) -> None:
        """Follow a trial's job from here on: its worker (an earlier run, a requeued worker) is gone."""
        self._claim(trial_id(frozen))
        run = Run(job.run_dir, self.launcher, self.layout, job=job)
        run.track(self.tracking, frozen.user_attrs.get(RUN_ID_ATTR))
        ended = " (ended; its result is told)" if job.poll() is not None else ""
        self._follow(frozen, optuna.Trial(self.study, trial_id(frozen)), run, f"re-attached to {job.describe()}{ended}")

    def _reattach_seeds(self, frozen: FrozenTrial) -> None:
        """Follow a repeated trial from here on, seed by seed: finished seeds kept, live seed jobs followed,
        the others started again from their own checkpoints (repeats.resume_trial)."""
        self._claim(trial_id(frozen))
        trial = optuna.Trial(self.study, trial_id(frozen))
        run, notes = repeats.resume_trial(self, trial, frozen.user_attrs.get(RUN_ID_ATTR))
        self._follow(frozen, trial, run, f"re-attached seed by seed ({'; '.join(notes)})")

    def _claim(self, trial_id: int) -> None:
        """This runner follows the trial from now on: its worker, with a fresh heartbeat."""
        self.storage.set_trial_system_attr(trial_id, WORKER_ATTR, self.worker)
        self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _follow(self, frozen: FrozenTrial, trial: optuna.Trial, run: Run, note: str) -> None:
        started = frozen.datetime_start.timestamp() if frozen.datetime_start else time.time()
        self.active.append(Active(trial, run, started))
        self.display.reattached(frozen.number, note)

    def _detach_surviving_jobs(self) -> None:
        """Stop following jobs that outlive this runner (SLURM): their trials stay RUNNING with their job
        ids, for the next runner."""
        for active in [a for a in self.active if _outlives(a)]:
            assert active.job is not None
            self.display.note(f"trial {active.trial.number}: {active.job.describe()} keeps running")
            self.left_running.append(active.job)
            self.active.remove(active)

    def _cancel_all(self) -> None:
        for active in self.active:
            if active.job is not None:
                active.job.cancel()
        deadline = time.time() + CANCEL_GRACE_S
        for active in list(self.active):
            outcome = None
            while active.job is not None and (outcome := active.job.poll()) is None and time.time() < deadline:
                time.sleep(POLL_S)
            self.active.remove(active)
            if outcome is not None:
                self._finish(active, outcome)
            else:
                self._fail(active, INTERRUPTED, kind=retries.INTERRUPTED)

    def _end_tracking(self, active: Active, status: str) -> None:
        """Closing a trial's MLflow run (its summary, artifacts and plots) takes seconds of drawing: it
        waits until the slot the trial freed runs its next trial (`_close_ended_runs`)."""
        self._ended.append((active, status))

    def _close_ended_runs(self) -> bool:
        """True when a run was closed (the study's own plots are then out of date)."""
        ended, self._ended = self._ended, []
        for active, status in ended:
            if active.run is not None:
                active.run.finish(status)
            else:  # it failed before its run folder was prepared
                self.tracking.finish_run(active.mlflow_run_id, None, status)
        if ended:
            self._ended_at = time.time()
        return bool(ended)


def _outlives(active: Active) -> bool:
    return active.job is not None and active.job.outlives_driver
