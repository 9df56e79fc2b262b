"""A full disk is named as the cause of a failed run (from the job's own output, or its folder's file system),
never as a cancel; a study stops on it in one line and runs the trial, a reference included, again."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

from abtune.attrs import FAIL_REASON_ATTR, REFERENCE_ATTR, RETRY_OF_ATTR
from abtune.launch.launchers import LocalJobHere
from abtune.launch.local import _failure_message
from abtune.launch.outcome import recorded_failure
from tests.conftest import CliResult
from tests.study_cli import in_process
from tests.study_helpers import trials_of, write_study
from tests.test_tracking_outage import SHORT_BASE, SHORT_SPACE

Abtune = Callable[..., CliResult]


def test_empty_failure_files_leave_the_exit_code_as_the_cause(tmp_path: Path) -> None:
    """A rank that failed on a full disk could not write why: its failure file is empty."""
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "crash_rank_0.txt").write_text("")
    assert recorded_failure(tmp_path) is None
    assert _failure_message(tmp_path, [1, None]) == "rank 0 exited with code 1"


def test_a_local_job_whose_log_says_its_disk_is_full_failed_on_it(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / f"{ended.pid}_0_log.out").write_text("submitit ERROR - Could not dump error:\n\n"
                                                 "because of [Errno 28] No space left on device\n")
    job = LocalJobHere({"host": socket.gethostname(), "pid": ended.pid, "start": None, "folder": str(jobs)}, tmp_path)
    outcome = job.poll()
    assert outcome is not None and not outcome.ok
    assert outcome.reason is not None and outcome.reason.startswith(
        f"local job {ended.pid} failed: no space left on device in {tmp_path} ("), outcome.reason


@pytest.fixture
def small_file_system(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: room for a trial's folder, not for its checkpoint."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.slow
def test_a_study_on_a_full_disk_stops_in_one_line_and_runs_its_reference_again(
        tmp_path: Path, small_file_system: Path, abtune_main: Abtune) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=2, references={"paper_defaults": False, "ddp": True},
                        base={**SHORT_BASE, "train": {**SHORT_BASE["train"], "checkpoint_every": 5}},
                        space=SHORT_SPACE, layout={"nproc": 1}, study_dir=str(small_file_system))
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)
    full = in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path,
                      check=False)

    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith("abtune: error: local job ") and "failed: no space left on device in " in error, error
    trials = trials_of(url)
    assert [(t.state, t.user_attrs.get(REFERENCE_ATTR)) for t in trials] == [(TrialState.FAIL, "ddp"),
                                                                            (TrialState.WAITING, "ddp")]
    assert "no space left on device" in trials[0].user_attrs[FAIL_REASON_ATTR]

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_file_system)], check=True)
    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path)
    trials = trials_of(url)
    assert [(t.state, t.user_attrs.get(RETRY_OF_ATTR)) for t in trials] == [
        (TrialState.FAIL, None), (TrialState.COMPLETE, 0), (TrialState.COMPLETE, None)]
