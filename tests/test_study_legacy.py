"""Studies written by earlier versions of abtune still report, stop and re-attach: their bookkeeping
spelled `abtune:...` where it now spells `abtune.` (abtune/attrs.py), and a trial's job was a
per-launcher attribute (`local_job`, `slurm_job_id`). Written here by hand into a real SQLite storage,
as those versions wrote it."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest

from abtune.launch.pids import process_alive, process_start
from abtune.study import lifecycle, reattach, stop
from abtune.study.storage import open_storage
from tests.conftest import run_cli
from tests.study_helpers import gone_worker, trials_of, write_study


def _old_study(tmp_path: Path) -> tuple[str, optuna.Study]:
    url = f"sqlite:///{tmp_path}/optuna.db"
    lifecycle.create(write_study(tmp_path / "s.yaml", references={"paper_defaults": False, "ddp": False}), None, url,
                     force=False)
    return url, optuna.load_study(study_name="tiny", storage=open_storage(url))


def _orphan(study: optuna.Study, tmp_path: Path, job: dict) -> optuna.Trial:
    """A RUNNING trial of a dead worker, written with the old names: `abtune:worker`, `abtune:heartbeat`
    and the job's own attribute."""
    trial = study.ask()
    storage = study._storage
    storage.set_trial_system_attr(trial._trial_id, "abtune:worker", gone_worker())
    storage.set_trial_system_attr(trial._trial_id, "abtune:heartbeat", time.time() - 3600)
    trial.set_user_attr("run_dir", str(tmp_path / "runs" / "trial"))
    for name, value in job.items():
        trial.set_user_attr(name, value)
    return trial


def _training_job(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict]:
    """A live process standing for a local job's controller, and its record as `LocalJob.record()` wrote it."""
    process = subprocess.Popen(["sleep", "300"])
    threading.Thread(target=process.wait, daemon=True).start()  # reaped once cancelled: no zombie looks alive
    record = {"host": socket.gethostname(), "pid": process.pid, "start": process_start(process.pid),
              "folder": str(tmp_path / "jobs")}
    return process, record


@pytest.mark.slow  # starts processes (a job, ranks): the whole suite's, not the fast tier's
def test_status_and_stop_read_a_trial_written_with_the_old_names(tmp_path: Path) -> None:
    url, study = _old_study(tmp_path)
    process, record = _training_job(tmp_path)
    try:
        trial = _orphan(study, tmp_path, {"local_job": record})
        status = run_cli("study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
        worker = trials_of(url)[trial.number].system_attrs["abtune:worker"]
        assert (f"running: trial {trial.number} in local job {process.pid} on {worker['host']}:{worker['pid']} "
                f"since ") in status, status
        assert "; its worker is gone (the next `abtune study run` re-attaches its job" in status, status

        out = run_cli("study", "stop", "tiny", "--storage", url, "--fail", cwd=tmp_path).stdout
        assert f"trial {trial.number}: local job {process.pid} cancelled, failed\n" in out, out
        assert not process_alive(record)
        assert trials_of(url)[trial.number].state == optuna.trial.TrialState.FAIL
    finally:
        process.kill()


def test_a_later_runner_follows_the_old_job_records(tmp_path: Path) -> None:
    url, study = _old_study(tmp_path)
    process, record = _training_job(tmp_path)
    try:
        local = _orphan(study, tmp_path, {"local_job": record})
        slurm = _orphan(study, tmp_path, {"slurm_job_id": "812_3"})
        trials = trials_of(url)
        local_job, slurm_job = (reattach.job_to_follow(trials[t.number]) for t in (local, slurm))
        assert local_job is not None and local_job.describe() == f"local job {process.pid}" and not local_job.gone()
        assert slurm_job is not None and slurm_job.describe() == "SLURM job 812_3"
    finally:
        process.kill()


def test_stop_reads_the_old_stop_request_and_worker_jobs(tmp_path: Path) -> None:
    url, study = _old_study(tmp_path)
    storage, study_id = study._storage, study._study_id
    watch = stop.StopWatch(storage, study_id)
    storage.set_study_system_attr(study_id, "abtune:stop", {"id": "an-earlier-stop", "mode": stop.FAIL, "at": 0.0})
    assert watch.new_request() == stop.FAIL
    storage.set_study_system_attr(study_id, "abtune:worker_jobs", ["812", "813"])
    storage.set_study_system_attr(study_id, "abtune:worker_job_kind", "local")
    assert stop.worker_jobs(storage, study_id) == ["812", "813"]
    assert stop.worker_launcher(storage, study_id).kind == "local"
