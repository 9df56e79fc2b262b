"""Launcher profiles and the launchers that need no SLURM: validation, --dry-run, local and debug runs."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from abtune.attrs import JOB_ATTR, RUN_ID_ATTR
from abtune.errors import ConfigError
from abtune.launch import slurm
from abtune.launch.base import JobQueue, Layout, StudyWorkers
from abtune.launch.launchers import (
    JOB_KINDS,
    LAUNCHERS,
    describe_job,
    launcher_for,
    launcher_type,
    load_launcher,
    load_profile,
    reattach,
    recorded_job,
    rerun_args,
    this_worker_job,
    worker_job,
)
from abtune.launch.outcome import recorded_failure
from abtune.launch.profiles import profile_names
from abtune.launch.slurm import SlurmProfile, parse_time_limit, sbatch_script
from abtune.runfiles import read_summary
from abtune.training.hooks import read_metrics
from tests.conftest import CliResult, run_cli, wait_for, write_config

SLURM_PROFILE = {"kind": "slurm", "partition": "gpu4", "nodes": 2, "tasks_per_node": 2, "time_limit": "0:30:00"}


def write_profile(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump({**SLURM_PROFILE, **fields}))
    return path


def without_slurm() -> dict[str, str]:
    """An environment whose PATH holds only this venv's tools: no sbatch, srun or sacct."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "PATH": str(Path(sys.executable).parent)}


def slurm_hidden() -> dict[str, str | None]:
    """without_slurm() as the changes `abtune_main`'s env takes: SLURM's variables unset, PATH this venv's tools."""
    return {**{k: None for k in os.environ if k.startswith("SLURM")}, "PATH": str(Path(sys.executable).parent)}


@pytest.mark.parametrize("name", ["local", "debug", "slurm", "horeka_example"])
def test_shipped_profiles_load(name: str) -> None:
    assert name in profile_names()
    assert load_profile(name).kind == ("slurm" if name in ("slurm", "horeka_example") else name)


AB = {"name": "ab"}


@pytest.mark.parametrize(
    ("fields", "method", "expected"),
    [
        ({"partitoin": "gpu"}, AB, "partitoin: unknown key (valid keys of a slurm profile: kind, partition,"),
        ({"nodes": 0}, AB, "nodes: Input should be greater than or equal to 1 (got 0)"),
        ({"time_limit": 10}, AB, "time_limit: 10 minutes is too short to checkpoint and requeue"),
        ({"time_limit": "0:14:00"}, AB, "time_limit: 14 minutes is too short"),
        ({"time_limit": 1}, AB, "time_limit: 1 minute is too short to checkpoint and requeue"),
        ({"time_limit": "2h"}, AB, "time_limit: expected minutes or sbatch's [D-]HH:MM:SS (30, 30:00, 2:00:00, "
                                   "1-12:00:00) (got '2h')"),  # the value once
        ({"mem": "lots"}, AB, "mem: String should match pattern"),
        ({"sbatch": {"time": "4:00:00"}}, AB, "sbatch: time is set by abtune; use the profile key time_limit"),
        ({"kind": "kubernetes"}, AB, "kind: expected one of local, debug, slurm, gridengine (got 'kubernetes')"),
        ({"worker": {"partitoin": "cpu"}}, AB,
         "worker.partitoin: unknown key (valid keys of worker: partition, account, qos, time_limit, cpus)"),
        ({"worker": {"time_limit": 5}}, AB, "worker.time_limit: 5 minutes is too short"),
        ({"nodes": 3, "tasks_per_node": 2}, {"name": "ab", "group_size": 3},
         "method.group_size 3 and tasks_per_node 2: AB's groups would straddle nodes"),
        ({"nodes": 1, "tasks_per_node": 1}, AB, "method ab needs at least 2 ranks"),
    ],
)
def test_bad_profile_gives_one_line_and_exit_2(tmp_path: Path, abtune_main: Callable[..., CliResult], fields: dict,
                                               method: dict, expected: str) -> None:
    config = write_config(tmp_path / "run.yaml", method=method)
    profile = write_profile(tmp_path / "bad.yaml", **fields)
    result = abtune_main("train", str(config), "--launcher", str(profile), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("abtune: error: ") and expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_unknown_profile_name_lists_the_choices(tmp_path: Path, tiny_config: Path,
                                                abtune_main: Callable[..., CliResult]) -> None:
    result = abtune_main("train", str(tiny_config), "--launcher", "slurmm")
    assert result.returncode == 2
    shipped = sorted(path.stem for path in (Path(__file__).parents[1] / "launchers").glob("*.yaml"))
    assert "slurm" in shipped and "local" in shipped
    assert result.stderr.strip() == (f"abtune: error: --launcher slurmm: no such profile; choose one of "
                                     f"{', '.join(shipped)} or give the path of a YAML file")


def test_nproc_is_refused_on_slurm(tmp_path: Path, tiny_config: Path, abtune_main: Callable[..., CliResult]) -> None:
    result = abtune_main("train", str(tiny_config), "--launcher", "slurm", "--nproc", "4")
    assert result.returncode == 2
    assert "--nproc and --ranks-per-node are for --launcher local; set nodes and tasks_per_node" in result.stderr


def test_time_limits_in_every_format_sbatch_takes() -> None:
    """Minutes quoted or not, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]."""
    values = (90, "30", "30:00", "30:30", "1:30:00", "1-00:00:00", "1-12", "1-12:30", "0:15:01")
    assert [parse_time_limit(v) for v in values] == [90, 30, 30, 31, 90, 1440, 2160, 2190, 16]
    for bad in ("2h", "1:2:3:4", "-5", "1-", ""):
        with pytest.raises(ValueError, match="expected minutes or sbatch's"):
            parse_time_limit(bad)
    assert SlurmProfile(time_limit="30").time_limit_min == 30  # the profile's comment says minutes: quoted too


@pytest.mark.parametrize("no_limit", [0, "0", "UNLIMITED", "infinite"])
def test_time_limit_0_is_sbatchs_no_limit_for_trials_and_workers(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                                 no_limit: int | str) -> None:
    config = write_config(tmp_path / "run.yaml", method={"name": "ab"})
    profile = write_profile(tmp_path / "p.yaml", time_limit=no_limit, worker={"time_limit": no_limit})
    script = abtune_main("train", str(config), "--launcher", str(profile), "--dry-run", cwd=tmp_path, env=slurm_hidden())
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --time=0" in script.stdout.splitlines(), script.stdout
    workers = slurm.worker_profile(load_profile(str(profile)))
    assert "#SBATCH --time=0" in slurm.array_script(tmp_path, slurm.WORKER_LAYOUT, workers, 2, "w").splitlines()


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path: Path) -> None:
    """Through the installed command: a --dry-run of `abtune train` on SLURM (the other refusals run in process)."""
    config = write_config(tmp_path / "run.yaml", method={"name": "ab"})
    profile = write_profile(tmp_path / "p.yaml", setup=["module load cuda/12.4"], sbatch={"constraint": "a100"},
                            account="proj-7")
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("train", str(config), "--launcher", str(profile), "--dry-run", cwd=tmp_path,
                     env=without_slurm())
    script = result.stdout
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --partition=gpu4", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --time=30", "#SBATCH --account=proj-7", "#SBATCH --constraint=a100",
                 f"#SBATCH --chdir={tmp_path}", "#SBATCH --signal=USR2@120", "module load cuda/12.4"):
        assert line in script.splitlines(), line
    srun = script.splitlines()[-1]
    assert srun.startswith("srun ") and "--kill-on-bad-exit=1" in srun
    words = shlex.split(srun)
    python = Path(words[words.index("-u") - 1])
    assert words[words.index("-u"):][:3] == ["-u", "-m", "submitit.core._submit"], srun
    # the python abtune runs on (the installed script's: .venv/bin/python3): the same interpreter in the same venv
    # as this test's, which may go by another name there (.venv/bin/python under `python -m pytest`)
    assert (python.parent, python.resolve()) == (Path(sys.executable).parent, Path(sys.executable).resolve()), srun
    assert sorted(tmp_path.rglob("*")) == before


def test_sbatch_script_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/src/abtune")
    profile = SlurmProfile(partition="gpu4", nodes=2, tasks_per_node=4, gpus_per_node=4, cpus_per_task=8,
                           mem="64G", time_limit="2:00:00", setup=("module load cuda",), python="/venv/bin/python",
                           workdir=Path("/home/me/project"), sbatch={"exclusive": True})
    script = sbatch_script(Path("/scratch/runs/r1"), Layout(2, 4), profile)
    assert script == GOLDEN_SCRIPT


GOLDEN_SCRIPT = """#!/bin/bash

# Parameters
#SBATCH --chdir=/home/me/project
#SBATCH --cpus-per-task=8
#SBATCH --error=/scratch/runs/r1/jobs/%j_0_log.err
#SBATCH --exclusive
#SBATCH --gpus-per-node=4
#SBATCH --job-name=abtune-r1
#SBATCH --mem=64G
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/scratch/runs/r1/jobs/%j_0_log.out
#SBATCH --partition=gpu4
#SBATCH --signal=USR2@120
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
export PYTHONPATH=/src/abtune
module load cuda

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /scratch/runs/r1/jobs/%j_%t_log.out --error /scratch/runs/r1/jobs/%j_%t_log.err \
--kill-on-bad-exit=1 /venv/bin/python -u -m submitit.core._submit /scratch/runs/r1/jobs
"""


@pytest.mark.slow  # trains: left out of the fast subset
def test_local_launcher_needs_no_slurm(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", method={"name": "ab"}, train={"steps": 12})
    result = run_cli("train", str(config), "--launcher", "local", "--nproc", "2", "--ranks-per-node", "1",
                     "--run-dir", str(tmp_path / "run"), "--no-tracking", env=without_slurm())
    summary = read_summary(tmp_path / "run").raw
    assert (summary["steps_done"], summary["num_nodes"], summary["ranks_per_node"]) == (12, 2, 1)
    assert "final top-1" in result.stdout


def test_slurm_launcher_without_slurm_is_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    config = write_config(tmp_path / "run.yaml", method={"name": "ab"})
    profile = write_profile(tmp_path / "p.yaml")
    result = abtune_main("train", str(config), "--launcher", str(profile), "--run-dir", str(tmp_path / "run"),
                         env=slurm_hidden())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'abtune: error: no SLURM here (Could not detect "srun", are you indeed on a slurm cluster?); '
        "use --launcher local"
    ]
    assert not (tmp_path / "run").exists()  # nothing ran: the same --run-dir works next time


def test_debug_launcher_runs_in_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = write_config(run_dir / "config.yaml", train={"steps": 5})
    assert config.exists()
    outcome = load_launcher("debug").submit(run_dir, Layout(1, 1)).wait()
    assert outcome.ok, outcome
    assert read_summary(run_dir).raw["steps_done"] == 5


@pytest.mark.slow  # starts processes (a job, ranks): the whole suite's, not the fast tier's
def test_local_submit_reports_the_failure(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_config(run_dir / "config.yaml", optimizer={"name": "sgd", "lr": 1e30, "momentum": 0.0})
    outcome = load_launcher("local").submit(run_dir, Layout(1, 1)).wait(poll_s=0.2)
    assert not outcome.ok and outcome.exit_code == 1
    assert outcome.reason is not None and "the loss became nan" in outcome.reason
    assert recorded_failure(run_dir) == outcome.reason


@pytest.mark.slow  # trains: left out of the fast subset
def test_a_cancelled_local_job_ends_without_a_result_at_once(tmp_path: Path) -> None:
    """A cancelled local job writes no result. submitit would wait 15 s for one before telling its end (a
    `study stop` waited that long a trial, one after the other: issue 21); the job tells it as soon as its
    controller has ended, with its own reason, never submitit's "ended abnormally" that follows the wait."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_config(run_dir / "config.yaml", train={"steps": 100_000, "log_every": 10})
    job = load_launcher("local").submit(run_dir, Layout(1, 1))
    wait_for(lambda: read_metrics(run_dir), 300, "the run to train")
    job.cancel()
    outcome = wait_for(job.poll, 300, "the cancelled job's end")
    assert not outcome.ok and outcome.reason == f"local job {job.job_id} ended without a result (cancelled or killed)"
    assert not list((run_dir / "jobs").glob("*_result.pkl"))


def test_recorded_failure_prefers_errors_to_crashes(tmp_path: Path) -> None:
    assert recorded_failure(tmp_path) is None
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "crash_rank_0.txt").write_text("rank 0: RuntimeError: peer gone\n\ntrace")
    assert recorded_failure(tmp_path) == "rank 0: RuntimeError: peer gone"
    assert recorded_failure(tmp_path, crashes=False) is None  # a killed job's echo
    (tmp_path / "failures" / "error_rank_3.txt").write_text("the loss became nan at step 7")
    assert recorded_failure(tmp_path) == "the loss became nan at step 7"
    assert recorded_failure(tmp_path, crashes=False) == "the loss became nan at step 7"


def test_profile_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_master_port_is_the_same_for_every_rank_and_below_the_ephemeral_ports() -> None:
    from abtune.launch.slurm import master_port

    ports = [master_port(str(job)) for job in range(1, 2001)]
    assert ports == [master_port(str(job)) for job in range(1, 2001)]  # every rank of a job agrees
    assert min(ports) >= 20000 and max(ports) < 32768  # Linux hands out 32768-60999 to outgoing connections
    assert len(set(ports)) == 2000  # jobs numbered close together never share a port (issue 25: EADDRINUSE)
    assert master_port("12001") == master_port("1")  # 12000 jobs apart, the range wraps


def test_nothing_above_the_launchers_looks_at_a_profiles_type() -> None:
    """Issue 16: the command line, studies and promotion ask the launcher, never `isinstance(profile, ...)`."""
    package = Path(__file__).resolve().parent.parent / "abtune"
    checks = [f"{path.relative_to(package)}:{number}"
              for path in package.rglob("*.py") if path.parent.name != "launch"
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"isinstance\(.*Profile", line)]
    assert checks == []


def test_nothing_above_the_launchers_names_a_cluster() -> None:
    """Issue 21: `study launch`, `study stop` and `study status` asked SLURM themselves (sinfo, squeue, scancel, job
    arrays); now only abtune/launch/ imports its SLURM modules or names its SLURM types."""
    package = Path(__file__).resolve().parent.parent / "abtune"
    named = [f"{path.relative_to(package)}:{number}"
             for path in package.rglob("*.py") if path.relative_to(package).parts[0] != "launch"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"abtune\.launch\.(slurm|capacity)|launch import .*\b(slurm|capacity)\b|Slurm(Launcher|Profile|Job)",
                          line)]
    assert named == []


@pytest.mark.parametrize("kind", sorted(LAUNCHERS))
def test_every_registered_launcher_answers_the_interface(kind: str, tmp_path: Path) -> None:
    """The one table of launchers: its profile schema, its jobs' kind, and the study-worker questions answered."""
    profile_type = LAUNCHERS[kind].profile_type
    launcher = launcher_for(profile_type.model_validate(SLURM_PROFILE if kind == "slurm" else {"kind": kind}))
    assert launcher.kind == launcher.job_type.kind == kind and launcher_type(kind) is type(launcher)
    assert (kind in JOB_KINDS) == launcher.job_type.followable == (kind != "debug")  # debug jobs die with abtune
    if isinstance(launcher, JobQueue):
        assert launcher.waiting_notes({}, []) == {} and launcher.queued([]) == []
    if isinstance(launcher, StudyWorkers):
        assert "#SBATCH --array=0-2%" in launcher.workers_script(tmp_path, 3, "w")
    else:
        from abtune.launch.launchers import study_workers

        with pytest.raises(ConfigError, match=f"which {kind} jobs do not; use a slurm profile"):
            study_workers(launcher)
    assert reattach("no-such-kind", {}, tmp_path) is None


def test_a_trial_s_job_reads_back_through_its_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study trial's job is one entry {kind, record, run_id}; what earlier versions stored per launcher
    (`slurm_job_id`, `local_job`) reads as the same entry. Its name, the re-run options and a worker's job
    come from the launcher, never from the study layer."""
    slurm_entry = {"kind": "slurm", "record": "812_3", "run_id": "r1"}
    assert recorded_job({JOB_ATTR: slurm_entry}) == slurm_entry
    assert recorded_job({"slurm_job_id": "812_3", RUN_ID_ATTR: "r1"}) == slurm_entry
    local = {"host": "node7", "pid": 4711, "start": "99", "folder": str(tmp_path)}
    assert recorded_job({"local_job": local}) == {"kind": "local", "record": local, "run_id": None}
    assert recorded_job({RUN_ID_ATTR: "r1"}) is None
    assert [describe_job(e) for e in (slurm_entry, recorded_job({"local_job": local}))] == ["SLURM job 812_3", "local job 4711"]
    assert rerun_args(slurm_entry, "/p/mycluster.yaml", 4, 2) == ["--launcher", "/p/mycluster.yaml"]
    assert rerun_args(None, "emulated", 4, 2) == ["--launcher", "emulated", "--nproc", "4", "--ranks-per-node", "2"]
    assert rerun_args(None, "local", 4, 2) == ["--nproc", "4", "--ranks-per-node", "2"]

    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert this_worker_job() == {}
    monkeypatch.setenv("SLURM_JOB_ID", "901")
    assert this_worker_job() == {"slurm_job": "901"}
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "900")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    stamp = {"host": "node7", "pid": 1, **this_worker_job()}
    assert worker_job(stamp) == (LAUNCHERS["slurm"], "900_1") and worker_job({"host": "node7", "pid": 1}) is None
