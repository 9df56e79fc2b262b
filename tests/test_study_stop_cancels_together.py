"""`abtune study stop` cancels the jobs of all the trials nobody follows any more before it waits for any of them
to end: one wait for every job (a SLURM job takes seconds to leave the queue), not one after another."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from abtune.launch.base import Job
from abtune.launch.outcome import RunOutcome
from abtune.study import stop
from abtune.study.spec import load_study_spec
from abtune.study.storage import open_storage
from tests.study_helpers import trials_of, write_study


class EndsOnceAllAreCancelled(Job):
    """A trial job that leaves its queue only once every job of the stop was cancelled, as jobs ending in
    parallel do; a stop that waits for one job before it cancels the next never sees it end."""

    kind = "fake"
    label = "fake job"
    events: list[str] = []
    count = 0

    def poll(self) -> RunOutcome | None:
        self.events.append(f"poll {self.job_id}")
        cancelled = [e for e in self.events if e.startswith("cancel")]
        return RunOutcome(False, "cancelled", 1) if len(cancelled) == self.count else None

    def cancel(self) -> None:
        self.events.append(f"cancel {self.job_id}")


def test_study_stop_cancels_every_unfollowed_trial_job_before_waiting_for_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    spec = load_study_spec(write_study(tmp_path / "s.yaml"))
    study = optuna.create_study(study_name="tiny", storage=url)
    trials = [study.ask() for _ in range(3)]
    jobs = {t.number: EndsOnceAllAreCancelled(str(10 + t.number), tmp_path) for t in trials}
    EndsOnceAllAreCancelled.events, EndsOnceAllAreCancelled.count = [], len(jobs)
    monkeypatch.setattr(stop, "follower_alive", lambda trial, stale_after_s: False)  # their runner was killed
    monkeypatch.setattr(stop, "_job_of", lambda trial: jobs[trial.number])
    monkeypatch.setattr(stop, "WAIT_S", 5.0)  # a stop that waits per job gives up on each after this
    monkeypatch.setattr(stop, "POLL_S", 0.01)
    said: list[str] = []

    stop.stop_study(open_storage(url), "tiny", spec, stop.REQUEUE, said.append)

    events = EndsOnceAllAreCancelled.events
    cancels = [e for e in events if e.startswith("cancel")]
    assert cancels == ["cancel 10", "cancel 11", "cancel 12"] and events.index("cancel 12") < events.index("poll 10"), events
    for number in jobs:
        assert f"trial {number}: fake job {10 + number} cancelled, failed and re-enqueued" in said, said
    stored = trials_of(url)
    assert [t.state for t in stored[:3]] == [TrialState.FAIL] * 3
    assert sorted(t.user_attrs["retry_of"] for t in stored[3:]) == [0, 1, 2]
