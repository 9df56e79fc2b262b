"""Study files and storage reads shared by the study tests."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from abtune.study.storage import open_storage
from tests.conftest import TINY_VIT, abtune_command, with_checkout_on_path

TINY_BASE = {"name": "tiny", "seed": 0, "model": dict(TINY_VIT), "data": {"name": "digits", "augment": False},
             "train": {"steps": 30, "local_batch_size": 16, "eval_every": 10, "log_every": 5},
             "optimizer": {"name": "adamw", "lr": 0.003}, "method": {"name": "ab"}}
TINY_SPACE = {"method.warmup_frac": {"low": 0.1, "high": 0.3},
              "method.sigma_cutoff": {"low": 0.01, "high": 0.5, "log": True}}


def write_study(path: Path, **fields: Any) -> Path:
    study = {"name": "tiny", "base": TINY_BASE, "layout": {"nproc": 2, "ranks_per_node": 1},
             "space": TINY_SPACE, "sampler": {"name": "random", "seed": 0}, "trials": 4}
    study.update(fields)
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def gone_worker() -> dict[str, Any]:
    """The stamp of a `study run` that is gone (killed, its host rebooted): `this_worker()` as a process that
    has since ended wrote it (a short `sleep`, not a Python that imports abtune for it)."""
    from abtune.launch.pids import process_start
    from abtune.study.workers import this_worker

    process = subprocess.Popen(["sleep", "60"])
    try:
        return {**this_worker(), "pid": process.pid, "start": process_start(process.pid)}
    finally:
        process.kill()
        process.wait()


def trials_of(url: str, name: str = "tiny") -> list[FrozenTrial]:
    storage = open_storage(url)
    return storage.get_all_trials(storage.get_study_id_from_name(name))


def study_attrs(url: str, name: str = "tiny") -> dict[str, Any]:
    storage = open_storage(url)
    return storage.get_study_user_attrs(storage.get_study_id_from_name(name))


def start_run(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """`abtune study run` in its own process group, as a terminal would start it. In pytest's session, so
    that the session's warm rank server forks its trials' ranks (a command in another session starts a
    server of its own: seconds of CPU for each)."""
    env = {**with_checkout_on_path(os.environ), "COLUMNS": "200"}  # as run_cli: it loads the tests' hooks
    return subprocess.Popen([*abtune_command(), "study", "run", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)


def signal_group(process: subprocess.Popen[str], sig: signal.Signals) -> None:
    os.killpg(process.pid, sig)


def running(url: str, name: str = "tiny") -> list[FrozenTrial]:
    try:
        return [t for t in trials_of(url, name) if t.state == TrialState.RUNNING]
    except Exception:  # the storage is being created by the process under test
        return []


@functools.cache
def _polled_storage(url: str) -> BaseStorage:
    """One storage per study for a test's polls (wait_for: five a second, for minutes under load): opening one
    costs 30 ms of CPU."""
    return open_storage(url)


def polled_running(url: str, name: str = "tiny") -> list[FrozenTrial]:
    """`running(url)` for polls: the storage opened once, and only the running trials read (3 ms of CPU a poll,
    not 35). The study must exist."""
    storage = _polled_storage(url)
    return storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False, states=(TrialState.RUNNING,))


def draw(url: str, trials: int, barrier: Any = None, name: str = "tiny") -> list[dict[str, Any]]:
    """The parameters a `study run` worker draws for its first `trials` trials (asked, never run). Its runner is
    built as `study run` builds it; with `barrier`, it then waits for the other workers, so that all of them
    have read the storage before any asks."""
    from abtune.study.runner import StudyRunner

    runner = StudyRunner(open_storage(url), name, url, parallel=1, max_trials=trials)
    if barrier is not None:
        barrier.wait(timeout=300)
    return [runner.study.ask(runner.distributions).params for _ in range(trials)]
