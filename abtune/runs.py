"""One run's lifecycle, the one way abtune starts a run: `abtune train`, `abtune compare`, study trials
(their seeds and confirmations) and promoted runs all go through it.

    run = Run.prepare(config, run_dir, launcher, layout, hooks=[...])   # the folder and its config.yaml
    run.track(tracking, run_id)          # the MLflow run it records into (its hook joins hooks.yaml)
    run.submit(job_name=...)             # returns at once; or run.run_here() in the foreground
    outcome = run.poll()                 # None while it runs (or run.wait())
    run.finish(outcome)                  # tracking learns how it ended and replays what rank 0 missed

Hooks (hooks.yaml) are resolved here, before any rank starts: a factory that cannot be imported is
refused in one line instead of failing on rank 0 after the start-up.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from abtune.config import RunConfig
from abtune.launch.base import DEFAULT_TIMEOUT_MIN, Job, Launcher, Layout
from abtune.launch.launchers import JOBS_DIR
from abtune.launch.outcome import RunOutcome
from abtune.rundir import prepare_run_dir
from abtune.tracking._base import Tracking
from abtune.training.hooks import configured_hook_specs, load_factory, write_hook_specs

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"  # how tracking records a run's end


@dataclass
class Run:
    run_dir: Path
    launcher: Launcher
    layout: Layout
    resume: bool = False
    hooks: list[dict[str, Any]] | None = None  # None: keep the hooks of the launch being resumed
    tracking: Tracking = field(default_factory=Tracking)
    run_id: str | None = None
    job: Job | None = None
    started: float = field(default_factory=time.time)

    @classmethod
    def prepare(cls, config: RunConfig, run_dir: Path | None, launcher: Launcher, layout: Layout, *,
                resume: bool = False, claim: bool = False, hooks: list[dict[str, Any]] | None = None) -> Run:
        """Write the folder's config.yaml (refusing a folder that holds another run); `claim`: this
        process launches the run and holds it against a second launch (runlock)."""
        folder = prepare_run_dir(config, run_dir, resume, claim)
        return cls(folder, launcher, layout, resume, hooks)

    def track(self, tracking: Tracking, run_id: str | None) -> None:
        self.tracking, self.run_id = tracking, run_id

    def previous_tracking_run(self) -> str | None:
        """The tracking run of the launch this one resumes (a resumed run is a new run pointing at it)."""
        return tracking_run_of(self.run_dir) if self.resume else None

    # --- starting -----------------------------------------------------------------------------
    def submit(self, *, job_name: str | None = None, timeout_min: int = DEFAULT_TIMEOUT_MIN,
               env: dict[str, str] | None = None) -> Job:
        """Hand the run to its launcher; `env` reaches its processes (and never a file)."""
        self._write_hooks()
        self.job = self.launcher.submit(self.run_dir, self.layout, resume=self.resume, job_name=job_name,
                                        timeout_min=timeout_min, env=env)
        return self.job

    def run_here(self, out: TextIO = sys.stdout) -> RunOutcome:
        """Run in the foreground until the end (Ctrl-C: KeyboardInterrupt)."""
        self._write_hooks()
        return self.launcher.run(self.run_dir, self.layout, resume=self.resume, out=out)

    def _write_hooks(self) -> None:
        """hooks.yaml: the run's hooks, then tracking's (replacing the one of an earlier launch)."""
        earlier = configured_hook_specs(self.run_dir)
        kept = self.hooks if self.hooks is not None else [s for s in earlier if s["factory"] != Tracking.HOOK_FACTORY]
        tracking = self.tracking.hook_spec(self.run_id)
        specs = [*kept, *([tracking] if tracking else [])]
        for spec in specs:
            load_factory(spec, self.run_dir)
        if specs or earlier:
            write_hook_specs(self.run_dir, specs)

    # --- following and ending -----------------------------------------------------------------
    def poll(self) -> RunOutcome | None:
        return None if self.job is None else self.job.poll()

    def wait(self) -> RunOutcome:
        assert self.job is not None, "submit first"
        return self.job.wait(self.launcher.poll_s)

    def finish(self, status: str = FINISHED, *, ran: bool = True) -> None:
        """Tell tracking how the run ended (FINISHED, FAILED, KILLED); `ran` False: nothing started, so
        there is nothing to replay."""
        self.tracking.finish_run(self.run_id, self.run_dir if ran else None, status)

    def finish_after_job(self) -> Job | None:
        """For a run nobody follows (`train --detach`): the launcher finishes its tracking run once the job
        has ended, however it ended (cancelled while pending included); None when untracked, or where jobs
        end with their driver."""
        if self.run_id is None or self.job is None:
            return None
        body = FinishTracking(str(self.run_dir.absolute()), self.job.kind, self.job.record())
        return self.launcher.after(self.job, body, self.run_dir.absolute() / JOBS_DIR)


@dataclass(frozen=True)
class FinishTracking:
    """The body of the job that runs after a detached run's job: tells tracking how the run ended, as a
    driver following it would have (`Run.finish`). The tracking store comes from the environment the job
    was submitted with."""

    run_dir: str
    kind: str
    record: Any

    def __call__(self) -> str:
        from abtune.launch.launchers import reattach
        from abtune.tracking import open_tracking

        run_dir = Path(self.run_dir)
        job = reattach(self.kind, self.record, run_dir)
        outcome = job.wait() if job is not None else RunOutcome(False, "its job is gone")
        return open_tracking().finish_run(tracking_run_of(run_dir), run_dir, status_of(outcome))


def tracking_run_of(run_dir: Path) -> str | None:
    """The tracking run that rank 0 of the folder's latest launch logs into (hooks.yaml)."""
    specs = [s for s in configured_hook_specs(run_dir) if s["factory"] == Tracking.HOOK_FACTORY]
    return specs[0]["options"]["run_id"] if specs else None


def status_of(outcome: RunOutcome) -> str:
    return FINISHED if outcome.ok else FAILED
