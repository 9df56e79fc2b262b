"""abtune's Grid Engine launcher on the real one-host cell (fixture in conftest.py): a run that trains as a local
one does, the job script of `--dry-run`, a job ended by qdel, and a machine without qsub."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from abtune.runfiles import read_summary
from abtune.training.hooks import read_metrics
from tests.conftest import abtune_command, wait_for, with_checkout_on_path, write_config

pytestmark = [pytest.mark.gridengine, pytest.mark.slow]

JOB_TIMEOUT_S = 300


def cell_profile(folder: Path, slots: int = 2) -> Path:
    path = folder / "cell.yaml"
    path.write_text(yaml.safe_dump({"kind": "gridengine", "queue": "all.q", "parallel_environment": "smp",
                                    "slots": slots, "time_limit": "0:30:00"}))
    return path


def files_of(run_dir: Path) -> set[str]:
    """What a run wrote, but the launcher's own job files (jobs/)."""
    return {str(path.relative_to(run_dir)) for path in run_dir.rglob("*")
            if path.is_file() and path.relative_to(run_dir).parts[0] != "jobs"}


def test_a_run_on_the_cell_writes_what_a_local_run_writes(gridengine_cell, tmp_path: Path,
                                                          abtune_main: Callable) -> None:
    config = write_config(tmp_path / "ddp.yaml", train={"steps": 20, "eval_every": 20, "log_every": 10})
    here, there = tmp_path / "local", tmp_path / "gridengine"
    assert abtune_main("train", str(config), "--nproc", "2", "--run-dir", str(here), "--no-tracking").returncode == 0

    result = abtune_main("train", str(config), "--launcher", str(cell_profile(tmp_path)), "--run-dir", str(there),
                         "--no-tracking")

    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split()[4].rstrip(":")
    assert result.stdout.startswith(f"submitted Grid Engine job {job_id}: 1 node(s) x 2 rank(s)")
    assert "final top-1" in result.stdout
    assert files_of(there) == files_of(here)
    local, remote = read_summary(here).raw, read_summary(there).raw
    assert (remote["world_size"], remote["num_nodes"], remote["steps_done"]) == (2, 1, 20)
    assert remote["final"] == local["final"]  # the same seed on the same layout: the same model
    assert [m["step"] for m in read_metrics(there)] == [m["step"] for m in read_metrics(here)]
    assert (there / "jobs" / f"gridengine-{job_id}.result.json").exists()


def test_dry_run_prints_the_job_script_and_submits_nothing(tmp_path: Path, abtune_main: Callable) -> None:
    config = write_config(tmp_path / "ddp.yaml")
    run_dir = tmp_path / "run"

    result = abtune_main("train", str(config), "--launcher", str(cell_profile(tmp_path, slots=4)),
                         "--run-dir", str(run_dir), "--dry-run")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#$ -pe smp 4", "#$ -q all.q", "#$ -l h_rt=0:30:00", f"#$ -N abtune-{run_dir.name}",
            f"#$ -o {run_dir}/jobs/gridengine-$JOB_ID.out"} <= set(lines)
    assert lines[-1].endswith(f"-m abtune.launch.gridengine.ranks {run_dir} --ranks 4")
    assert not run_dir.exists()


def test_a_job_deleted_with_qdel_ends_the_run_with_that_cause(gridengine_cell, tmp_path: Path) -> None:
    config = write_config(tmp_path / "long.yaml", train={"steps": 100_000, "eval_every": 100_000, "log_every": 10})
    run_dir = tmp_path / "run"
    command = [*abtune_command(), "train", str(config), "--launcher", str(cell_profile(tmp_path)),
               "--run-dir", str(run_dir), "--no-tracking"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=with_checkout_on_path(os.environ)) as cli:
        first = cli.stdout.readline() if cli.stdout else ""
        assert first.startswith("submitted Grid Engine job "), first
        job_id = first.split()[4].rstrip(":")
        wait_for(lambda: bool(read_metrics(run_dir)), JOB_TIMEOUT_S, "the run to train")
        subprocess.run(["qdel", job_id], check=True, timeout=30, capture_output=True)
        _, stderr = cli.communicate(timeout=JOB_TIMEOUT_S)

    assert cli.returncode == 1, stderr
    assert stderr.strip().splitlines() == [
        f"abtune: error: Grid Engine job {job_id} ended without a result: killed (qdel, or a limit such as h_rt; "
        f"exit status 137) (run folder {run_dir}; no checkpoint to resume from)"]


def test_without_qsub_the_run_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable) -> None:
    config = write_config(tmp_path / "ddp.yaml")
    run_dir = tmp_path / "run"

    result = abtune_main("train", str(config), "--launcher", str(cell_profile(tmp_path)), "--run-dir", str(run_dir),
                         "--no-tracking", env={"PATH": str(tmp_path / "no-tools")})

    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "abtune: error: qsub not found: Grid Engine's commands are not on PATH here; run abtune where qsub works "
        "(a login node of the cluster, after its settings.sh), or install gridengine-client"]
    assert not run_dir.exists()  # a refused submission leaves nothing behind: the same --run-dir works again
