"""A `study run` killed with SIGKILL leaves its local trial jobs training; the next one follows them."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow import MlflowClient
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import JOB_ATTR, RUN_ID_ATTR
from abtune.launch.pids import process_alive
from abtune.study.stop import STOPPED
from abtune.training.hooks import read_metrics
from tests.conftest import CliResult, abtune_command, wait_for, with_checkout_on_path
from tests.gate import gate_spec, paused, release
from tests.study_cli import in_process
from tests.study_helpers import TINY_BASE, polled_running, running, trials_of, write_study

pytestmark = pytest.mark.slow
TRAIN = {"steps": 40, "local_batch_size": 16, "eval_every": 40, "log_every": 20}
# Every trial (and seed) holds at step 20 until the test releases it (tests/gate.py): its job is mid-training
# for as long as a kill, a restart or a stop takes, however loaded the machine, and trains 40 steps in all
# (a step logged after the gate, and one more: each logged once shows one training).
HOOKS = [gate_spec(20)]


def _logged_steps(trial: FrozenTrial) -> list[int]:
    run_dir = trial.user_attrs.get("run_dir")  # set once the trial's folder is prepared
    return [r["step"] for r in read_metrics(Path(run_dir)) if r["kind"] == "log"] if run_dir else []


def _held(url: str, count: int) -> list[FrozenTrial] | None:
    """`count` running trials whose jobs are held at the gate, mid-training."""
    trials = [t for t in polled_running(url) if JOB_ATTR in t.user_attrs and paused(Path(t.user_attrs["run_dir"]))]
    return trials if len(trials) == count else None


def _study_run(tmp_path: Path, url: str, log: str, *args: str) -> subprocess.Popen[bytes]:
    """`study run` in a process group of its own, as a terminal starts it, the checkout on its path (the gate).
    In pytest's session, so that the warm rank server forks its trials' ranks (it cannot for another session)."""
    with (tmp_path / log).open("w") as out:
        return subprocess.Popen([*abtune_command(), "study", "run", "tiny", "--storage", url, *args], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, process_group=0,
                                env={**with_checkout_on_path(os.environ), "COLUMNS": "200"})


def _releasing_every_gate(runner: subprocess.Popen[bytes], url: str, run_dirs: Callable[[FrozenTrial], list[Path]],
                          timeout_s: float = 300) -> int:
    """Let every trial the runner starts train past its gate; the runner's exit code."""
    def ended() -> bool:
        for trial in polled_running(url):
            for run_dir in run_dirs(trial):
                if paused(run_dir):
                    release(run_dir)
        return runner.poll() is not None
    wait_for(ended, timeout_s, "the study run to end")
    return runner.wait()


def _trial_dir(trial: FrozenTrial) -> list[Path]:
    return [Path(trial.user_attrs["run_dir"])] if "run_dir" in trial.user_attrs else []


def test_killed_study_run_reattaches_its_surviving_local_trials(tmp_path: Path,
                                                                abtune_main: Callable[..., CliResult]) -> None:
    """SIGKILL of `study run --parallel 2` (the runner alone, its jobs live on) mid-trial; the restarted
    run re-attaches both trials: same numbers, one job and one training each, no FAIL or retry, the
    budget completes with contiguous numbers."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=3, base={**TINY_BASE, "train": TRAIN},
                        references={"paper_defaults": False, "ddp": False}, hooks=HOOKS)
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
    first = _study_run(tmp_path, url, "first.log", "--parallel", "2", "--no-tracking")
    killed = wait_for(lambda: _held(url, 2), 300, "two trials training")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    jobs = {t.number: t.user_attrs[JOB_ATTR]["record"] for t in killed}
    assert [t.number for t in running(url)] == sorted(jobs)  # left RUNNING by the dead runner ...
    assert all(process_alive(job) for job in jobs.values())  # ... and their jobs train on
    status = abtune_main("study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert all(f"running: trial {n} in local job {job['pid']} on " in status for n, job in jobs.items()), status
    assert status.count("; its worker is gone (the next `abtune study run` re-attaches its job") == 2, status

    second = _study_run(tmp_path, url, "second.log", "--parallel", "2", "--no-tracking")
    # still held: the restarted run finds both jobs training, and follows them (not a result told after the fact)
    wait_for(lambda: all(f"trial {n}: re-attached to local job {job['pid']}\n" in (tmp_path / "second.log").read_text()
                         for n, job in jobs.items()) or second.poll() is not None, 300, "both trials re-attached")
    assert _releasing_every_gate(second, url, _trial_dir) == 0, (tmp_path / "second.log").read_text()
    out = (tmp_path / "second.log").read_text()
    trials = trials_of(url)
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(3)]
    assert not [t for t in trials if "retry_of" in t.user_attrs or "fail_reason" in t.user_attrs]
    for number, job in jobs.items():
        trial = trials[number]
        assert f"trial {number}: re-attached to local job {job['pid']}\n" in out, out  # no "(ended; ...)"
        assert f"trial {number} started" not in out, out  # it started under the first runner
        assert trial.user_attrs[JOB_ATTR]["record"] == job  # followed, never resubmitted
        run_dir = Path(trial.user_attrs["run_dir"])
        assert len(list((run_dir / "jobs").glob("*_result.pkl"))) == 1  # one job ran in this folder
        steps = _logged_steps(trial)
        assert steps == list(range(20, TRAIN["steps"] + 1, 20))  # each step logged once, in order: one training
        assert [r["kind"] for r in read_metrics(run_dir)].count("summary") == 1
        assert trial.user_attrs["steps_done"] == TRAIN["steps"]


def test_study_stop_local(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """`study stop` of a local `study run`: the runner cancels its trials (re-enqueued); trials of a killed
    runner have their jobs cancelled by the stop itself (failed, with --fail); --let-trials-finish lets the
    runner finish its trial and tell it. Nothing is left RUNNING, no trial job process lives on."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=3, base={**TINY_BASE, "train": TRAIN},
                        references={"paper_defaults": False, "ddp": False}, hooks=HOOKS)
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
    stop = ("study", "stop", "tiny", "--storage", url)

    runner = _study_run(tmp_path, url, "first.log", "--parallel", "2", "--no-tracking")  # tracked: the second
    first = wait_for(lambda: _held(url, 2), 300, "two trials training")
    out = in_process(abtune_main, *stop, cwd=tmp_path).stdout
    assert runner.wait(timeout=60) == 130
    trials = trials_of(url)
    assert "asked its workers to start no new trial" in out, out
    for trial, retry in zip(first, trials[2:], strict=True):  # each trial's fate, not "no trial is running"
        assert (f"trial {trial.number}: its worker stopped it ({STOPPED}): failed, re-enqueued as trial "
                f"{retry.number}\n") in out, out
    # That the runner does not wait for the result a cancelled job never writes (submitit waited 15 s a trial,
    # issue 21) is checked where it is decided: tests/test_launchers.py, the cancelled local job's outcome.
    # the jobs' KeyboardInterrupt tracebacks (their tasks', stopped by the cancel's SIGTERM) go to their job
    # folders, not the user's output
    assert "Traceback" not in (tmp_path / "first.log").read_text()
    assert all(any("KeyboardInterrupt" in log.read_text() for log in (Path(t.user_attrs["run_dir"]) / "jobs").glob("*.err"))
               for t in first)
    assert [(t.number, t.state, t.user_attrs.get("fail_reason")) for t in trials[:2]] == \
        [(t.number, TrialState.FAIL, STOPPED) for t in first]
    assert [(t.state, t.user_attrs["retry_of"]) for t in trials[2:]] == [(TrialState.WAITING, t.number) for t in first]
    assert not any(process_alive(t.user_attrs[JOB_ATTR]["record"]) for t in first)

    runner = _study_run(tmp_path, url, "second.log", "--parallel", "2")
    second = wait_for(lambda: _held(url, 2), 300, "the two retries training")
    os.kill(runner.pid, signal.SIGKILL)  # its trials' jobs live on, followed by nobody
    runner.wait(timeout=60)
    out = in_process(abtune_main, *stop, "--fail", cwd=tmp_path).stdout
    tracking = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    for trial in second:
        job = trial.user_attrs[JOB_ATTR]["record"]
        assert f"trial {trial.number}: local job {job['pid']} cancelled, failed\n" in out, out
        assert not process_alive(job)
        assert trials_of(url)[trial.number].user_attrs["fail_reason"] == STOPPED
        # the dead runner cannot close its trials' MLflow runs: the stop does (they stayed RUNNING, issue 21)
        assert tracking.get_run(trial.user_attrs[RUN_ID_ATTR]).info.status == "FAILED"
    assert not running(url) and not [t for t in trials_of(url) if t.state == TrialState.WAITING]

    runner = _study_run(tmp_path, url, "third.log", "--parallel", "2", "--no-tracking")
    last = wait_for(lambda: _held(url, 1), 300, "the last trial training")
    out = in_process(abtune_main, *stop, "--let-trials-finish", cwd=tmp_path).stdout
    assert f"trial {last[0].number}: its worker" in out and "follows it to its end" in out, out
    release(Path(last[0].user_attrs["run_dir"]))  # only now may it train on to its end
    assert runner.wait(timeout=300) == 0
    trials = trials_of(url)
    assert trials[-1].number == last[0].number and trials[-1].state == TrialState.COMPLETE
    assert len(trials) == 5 and not running(url)


# --- repeated trials (repeats: 2) -----------------------------------------------------------------------
def _seed_steps(trial: FrozenTrial, seed: int) -> list[int]:
    return [r["step"] for r in read_metrics(Path(trial.user_attrs["run_dir"]) / f"seed_{seed}") if r["kind"] == "log"]


def _seed_dirs(trial: FrozenTrial) -> list[Path]:
    return [Path(trial.user_attrs["run_dir"]) / f"seed_{s}" for s in trial.user_attrs.get("seeds", [])]


def _seeds_mid_training(url: str) -> FrozenTrial | None:
    """The running trial once both of its seeds have a recorded job and are held at the gate."""
    for trial in polled_running(url):
        seeds, jobs = trial.user_attrs.get("seeds", []), trial.user_attrs.get("seed_jobs", {})
        if len(seeds) == len(jobs) == 2 and all(paused(d) for d in _seed_dirs(trial)):
            return trial
    return None


def _repeated_study_killed_mid_trial(tmp_path: Path, tracking: str,
                                     abtune_main: Callable[..., CliResult]) -> tuple[str, FrozenTrial]:
    """A `repeats: 2` study whose runner was SIGKILLed while both seeds of its trial trained (they train on)."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=1, repeats=2, base={**TINY_BASE, "train": TRAIN},
                        references={"paper_defaults": False, "ddp": False}, hooks=HOOKS)
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
    first = _study_run(tmp_path, url, "first.log", "--tracking-uri", tracking)
    trial = wait_for(lambda: _seeds_mid_training(url), 300, "both seeds of a trial training")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    assert all(process_alive(entry["record"]) for entry in trial.user_attrs["seed_jobs"].values())
    return url, trial


def _mlflow_statuses(tracking: str) -> dict[str, str]:
    client = MlflowClient(tracking)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {run.info.run_name: run.info.status for run in runs}


def test_a_killed_runner_s_repeated_trial_is_re_attached_seed_by_seed(tmp_path: Path, mlflow_db: Path,
                                                                       abtune_main: Callable[..., CliResult]) -> None:
    """Issue 21: the restarted runner failed such a trial as stale and its retry trained both seeds again while the
    abandoned ones finished on their own. Now it follows the seeds' jobs: each seed trains once, every step once."""
    tracking = f"sqlite:///{mlflow_db}"
    url, trial = _repeated_study_killed_mid_trial(tmp_path, tracking, abtune_main)
    jobs = trial.user_attrs["seed_jobs"]
    second = _study_run(tmp_path, url, "second.log", "--tracking-uri", tracking)
    following = (f"trial {trial.number}: re-attached seed by seed (seed 0: following local job "
                 f"{jobs['0']['record']['pid']}; seed 1000: following local job {jobs['1000']['record']['pid']})")
    # still held: the restarted run finds both seeds training and follows their jobs
    wait_for(lambda: following in (tmp_path / "second.log").read_text() or second.poll() is not None, 300,
             "the seeds re-attached")
    assert _releasing_every_gate(second, url, _seed_dirs) == 0, (tmp_path / "second.log").read_text()
    out = (tmp_path / "second.log").read_text()
    assert following in out, out
    (done,) = trials_of(url)  # no FAIL, no retry
    assert done.number == trial.number and done.state == TrialState.COMPLETE and "retry_of" not in done.user_attrs
    for seed in done.user_attrs["seeds"]:
        assert _seed_steps(done, seed) == list(range(20, TRAIN["steps"] + 1, 20))  # one training: each step once
        assert len(list((Path(done.user_attrs["run_dir"]) / f"seed_{seed}" / "jobs").glob("*_result.pkl"))) == 1
    assert not any(process_alive(entry["record"]) for entry in jobs.values())
    assert set(_mlflow_statuses(tracking).values()) == {"FINISHED"}, _mlflow_statuses(tracking)


def test_study_stop_cancels_every_seed_of_a_dead_runner_s_repeated_trial(
        tmp_path: Path, mlflow_db: Path, abtune_main: Callable[..., CliResult]) -> None:
    """`study stop` once could not reach such seeds: they trained on with no runner. Now it cancels them, fails the
    trial, and closes the trial's and the seeds' MLflow runs."""
    tracking = f"sqlite:///{mlflow_db}"
    url, trial = _repeated_study_killed_mid_trial(tmp_path, tracking, abtune_main)  # its seeds held at the gate meanwhile
    jobs = trial.user_attrs["seed_jobs"]
    out = in_process(abtune_main, "study", "stop", "tiny", "--fail", "--storage", url, "--tracking-uri", tracking,
                     cwd=tmp_path).stdout
    pids = ", ".join(f"local job {jobs[str(s)]['record']['pid']}" for s in sorted(int(s) for s in jobs))
    assert f"trial {trial.number}: {pids} cancelled, failed\n" in out, out
    assert not any(process_alive(entry["record"]) for entry in jobs.values())
    assert not running(url) and trials_of(url)[trial.number].state == TrialState.FAIL
    statuses = _mlflow_statuses(tracking)
    assert "RUNNING" not in statuses.values() and statuses[f"trial-{trial.number}"] == "FAILED", statuses
