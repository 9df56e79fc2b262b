"""Studies on the real two-node SLURM cluster (fixture in conftest.py): `abtune study launch` on a
job array of workers, `abtune study run --launcher` stopped and re-attached, and a trial job cancelled
with scancel. Every trial is a SLURM job of 2 nodes x 1 rank; the storage is SQLite in the test's
folder (one machine: both nodes see it)."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import JOB_ATTR, WORKER_ATTR
from abtune.launch.slurm import POLL_SECONDS, attach
from abtune.runfiles import read_summary
from abtune.study.stop import STOPPED
from tests.conftest import CliResult, run_cli, wait_for
from tests.gate import gate_spec, paused, release
from tests.slurm import rpc_counts
from tests.slurm.test_launcher_slurm import JOB_TIMEOUT_S, cluster_profile, preempt, sacct_states
from tests.study_cli import in_process
from tests.study_helpers import (
    TINY_BASE,
    polled_running,
    running,
    signal_group,
    start_run,
    trials_of,
    write_study,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # slow too: `-m "not slow"` is the quick subset

FINISHED = {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL}
NO_REFERENCES = {"paper_defaults": False, "ddp": False}
# A trial that must still train when the test acts holds at step 20 until the test releases it (tests/gate.py).
HELD = [gate_spec(20)]
HELD_RUN_STEPS = 30  # one logged step (30) after the gate's: a trial released there ends soon after
# squeue calls a worker may make for one trial job beyond one per poll: its first look after the
# submission and the one that sees it end
STATUS_RPCS_PER_TRIAL_JOB = 2


@pytest.fixture
def profile(slurm_cluster, tmp_path: Path) -> Path:
    """A trial is 2 nodes x 1 rank (the study files' layout, so the same trials run locally)."""
    return cluster_profile(tmp_path, slurm_cluster.partition, tasks_per_node=1)


Cli = Callable[..., CliResult]


@pytest.fixture
def cli(abtune_main: Cli) -> Cli:
    """`abtune ARGS` in this process, as the local study tests run it (tests/study_cli.py): a new Python per command
    costs seconds of this 2-core machine (25 s at load 8). An exit other than 0 fails the test with what the
    command printed, unless `check=False`. The jobs it submits get this process's environment, with the checkout
    on PYTHONPATH as run_cli gives it, so that their trials load the tests' gate. `study run` that is stopped with
    Ctrl-C keeps a process of its own (start_run); `study launch` keeps one test through the installed command."""
    return functools.partial(in_process, abtune_main)


def created_study(cli: Cli, tmp_path: Path, steps: int, **fields: object) -> str:
    url = f"sqlite:///{tmp_path}/optuna.db"
    train = {**TINY_BASE["train"], "steps": steps, "eval_every": steps, "log_every": 10}
    study = write_study(tmp_path / "s.yaml", base={**TINY_BASE, "train": train}, **fields)
    cli("study", "create", str(study), "--storage", url, cwd=tmp_path)
    return url


def submitted_trial(url: str) -> FrozenTrial | None:
    """A RUNNING trial that has its SLURM job (pending, starting or training)."""
    return next((t for t in polled_running(url) if t.user_attrs.get(JOB_ATTR)), None)


def held_trial(url: str) -> FrozenTrial | None:
    """A RUNNING trial whose job holds at the gate, mid-training."""
    return next((t for t in polled_running(url) if t.user_attrs.get(JOB_ATTR) and paused(run_dir(t))), None)


def run_dir(trial: FrozenTrial) -> Path:
    return Path(trial.user_attrs["run_dir"])


def summary(trial: FrozenTrial) -> dict:
    return read_summary(Path(trial.user_attrs["run_dir"])).raw


def test_study_launch_runs_the_budget_on_a_job_array(
        tmp_path: Path, profile: Path, mlflow_db: Path, cli: Cli) -> None:
    url = created_study(cli, tmp_path, steps=30, trials=3, references={"paper_defaults": True, "ddp": False})
    tracking = f"sqlite:///{mlflow_db}"
    launch = ("study", "launch", "tiny", "--workers", "2", "--launcher", str(profile), "--storage", url,
              "--tracking-uri", tracking)

    dry = cli(*launch, "--dry-run", cwd=tmp_path).stdout
    assert "#SBATCH --array=0-1%2" in dry and "#SBATCH --nodes=2" in dry  # workers, then a trial
    assert not (tmp_path / "runs").exists() and trials_of(url) and not running(url)  # nothing submitted

    rpc_counts.reset()
    out = run_cli(*launch, cwd=tmp_path).stdout
    match = re.search(r"SLURM job\(s\) (\d+)_0 \1_1\n", out)
    assert match, out
    ids = [f"{match[1]}_0", f"{match[1]}_1"]
    # waiting on the workers' result files asks the daemons nothing: every job-status RPC counted is abtune's
    wait_for(lambda: len(list(tmp_path.rglob("workers/*_result.pkl"))) == 2, 2 * JOB_TIMEOUT_S, "the workers")
    controller, database = rpc_counts.controller(), rpc_counts.database()
    wait_for(lambda: all(sacct_states(i)[-1:] == ["COMPLETED"] for i in ids), JOB_TIMEOUT_S, "the workers' ends")
    _check_rpc_budget(controller, database, ids, trial_jobs=3)

    # the budget is counted across the workers: a worker that asked just as the other took the last
    # trial runs nothing for it (FAIL, over_budget, no job)
    everything = trials_of(url)
    trials = [t for t in everything if not t.user_attrs.get("over_budget")]
    assert len(trials) == 3 and len(everything) <= 4, [(t.number, t.state, t.user_attrs) for t in everything]
    for extra in (t for t in everything if t not in trials):
        assert extra.state == TrialState.FAIL and JOB_ATTR not in extra.user_attrs
    assert {t.system_attrs[WORKER_ATTR]["slurm_job"] for t in trials} == set(ids)  # both workers worked
    job_ids = [t.user_attrs[JOB_ATTR]["record"] for t in trials]
    assert len(set(job_ids)) == len(trials) and all(sacct_states(j) == ["COMPLETED"] for j in job_ids)
    for trial in trials:
        assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("fail_reason")
        assert trial.user_attrs["launcher"] == str(profile)  # the profile it ran with, not the shipped `slurm`
        run = summary(trial)
        assert (run["world_size"], run["num_nodes"], run["steps_done"]) == (2, 2, 30)
        assert trial.values == [run["final"]["val_top1"]] == [trial.user_attrs["top1"]]
    assert trials[0].user_attrs["reference"] == "paper-defaults"
    searched = [tuple(sorted(t.params.items())) for t in trials[1:]]
    assert len(set(searched)) == len(searched), searched  # two workers started together seed apart
    _check_one_child_run_per_trial(tracking, trials)
    best = cli("study", "best", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert re.search(rf"run it again: abtune train \S+/config.yaml --launcher {re.escape(str(profile))}\n", best), best
    again = cli(*launch, cwd=tmp_path).stdout
    assert again.startswith("study tiny: budget spent (3 trials), nothing launched; add trials with")
    assert len(trials_of(url)) == len(everything)

    # the storage URL reached the jobs through their environment only: in no script, no pickle
    files = [p for p in (tmp_path / "runs").rglob("*") if p.suffix in (".sh", ".pkl")]
    assert len(files) >= 2 * len(trials)
    assert not [p for p in files if str(tmp_path / "optuna.db").encode() in p.read_bytes()]


def _check_rpc_budget(controller: dict[str, int], database: dict[str, int], workers: list[str],
                      trial_jobs: int) -> None:
    """The RPC budget of a study's polling, from the daemons' own counts: a worker asks squeue once per
    poll for all the jobs it follows (slurm.QueueView) and sacct never while the controller knows the
    job. Before, every poll of a trial job was a forced sacct: a slurmdbd RPC per job every 2 s."""
    followed_s = sum(_elapsed_s(worker) for worker in workers)
    polls = followed_s / POLL_SECONDS
    assert database.get(rpc_counts.SACCT, 0) <= trial_jobs, (database, polls)
    assert rpc_counts.job_info(controller) <= polls + STATUS_RPCS_PER_TRIAL_JOB * trial_jobs, (controller, polls)


def _elapsed_s(job_id: str) -> float:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "ElapsedRaw"], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return float(out.split()[-1])


def test_study_run_stopped_and_rerun_reattaches_the_trial_job(tmp_path: Path, profile: Path, cli: Cli) -> None:
    url = created_study(cli, tmp_path, steps=HELD_RUN_STEPS, trials=1, references=NO_REFERENCES, hooks=HELD)
    runner = start_run(tmp_path, "tiny", "--launcher", str(profile), "--storage", url, "--no-tracking")
    # Stop as soon as the job exists; the job holds at the gate until the rerun, so it is still training
    # when the runner handles Ctrl-C.
    trial = wait_for(lambda: submitted_trial(url), JOB_TIMEOUT_S, "a trial's job to be submitted")
    job_id = trial.user_attrs[JOB_ATTR]["record"]
    signal_group(runner, signal.SIGINT)
    _, err = runner.communicate(timeout=JOB_TIMEOUT_S)
    assert runner.returncode == 130 and f"SLURM job(s) {job_id} keep running" in err, err
    assert [(t.number, t.state) for t in trials_of(url)] == [(trial.number, TrialState.RUNNING)]
    status = cli("study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert f"running: trial {trial.number} in SLURM job {job_id} on " in status

    release(run_dir(trial))  # it may end before the rerun looks (then its result is told): both re-attach it
    out = cli("study", "run", "tiny", "--launcher", str(profile), "--storage", url, "--no-tracking",
              cwd=tmp_path).stdout
    assert f"trial {trial.number}: re-attached to SLURM job {job_id}" in out
    trials = trials_of(url)
    assert [(t.number, t.state) for t in trials] == [(trial.number, TrialState.COMPLETE)]  # no duplicate
    assert trials[0].user_attrs[JOB_ATTR]["record"] == job_id and summary(trials[0])["steps_done"] == HELD_RUN_STEPS
    assert sacct_states(job_id) == ["COMPLETED"]  # the same job: not cancelled by the stop, never resubmitted


def test_cancelled_trial_job_fails_its_trial_and_the_study_goes_on(
        tmp_path: Path, profile: Path, cli: Cli, killed_promptly: None) -> None:
    url = created_study(cli, tmp_path, steps=HELD_RUN_STEPS, trials=2, references=NO_REFERENCES, hooks=HELD)

    def cancel_the_first_release_the_second() -> FrozenTrial:  # beside the runner, which runs in this process
        # held mid-training, so the cancel cannot come after the job's end (on an idle machine it once did)
        trial = wait_for(lambda: held_trial(url), JOB_TIMEOUT_S, "a trial's job held mid-training")
        subprocess.run(["scancel", trial.user_attrs[JOB_ATTR]["record"]], check=True, timeout=30)
        second = wait_for(lambda: next((t for t in polled_running(url) if t.number != trial.number
                                        and t.user_attrs.get(JOB_ATTR) and paused(run_dir(t))), None),
                          2 * JOB_TIMEOUT_S, "the next trial held")
        release(run_dir(second))
        return trial

    with ThreadPoolExecutor(1) as beside:
        acting = beside.submit(cancel_the_first_release_the_second)
        out = cli("study", "run", "tiny", "--launcher", str(profile), "--storage", url, "--no-tracking",
                  cwd=tmp_path).stdout
        trial = acting.result()
    job_id = trial.user_attrs[JOB_ATTR]["record"]

    first, second = trials_of(url)
    assert first.number == trial.number and first.state == TrialState.FAIL
    assert first.user_attrs["fail_reason"] == f"SLURM job {job_id} CANCELLED"
    assert second.state == TrialState.COMPLETE and second.user_attrs[JOB_ATTR]["record"] != job_id
    assert "CANCELLED" in out


def test_sbatch_refusal_is_one_line_and_loses_no_trial(tmp_path: Path, profile: Path, cli: Cli) -> None:
    url = created_study(cli, tmp_path, steps=30, trials=2, references=NO_REFERENCES)
    bad = tmp_path / "bad.yaml"
    bad.write_text(profile.read_text().replace("partition: debug", "partition: nosuchpart"))
    unknown_partition = ("abtune: error: partition: nosuchpart is not a partition of this cluster (sinfo lists "
                         "debug); set one of them in the launcher profile\n")
    for command in ("launch", "run"):  # both ask sinfo before any trial: nothing reaches sbatch
        refused = cli("study", command, "tiny", "--launcher", str(bad), "--storage", url, cwd=tmp_path,
                      check=False)
        assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", unknown_partition)
    assert trials_of(url) == []

    featureless = tmp_path / "featureless.yaml"  # what sinfo cannot tell: sbatch refuses the trial's job itself
    featureless.write_text(profile.read_text() + "sbatch: {constraint: nosuchfeature}\n")
    run = cli("study", "run", "tiny", "--launcher", str(featureless), "--storage", url, cwd=tmp_path, check=False)
    assert (run.returncode, run.stderr) == (
        2, "abtune: error: sbatch refused the job: Batch job submission failed: Invalid feature specification\n")
    asked, retry = trials_of(url)  # the trial that could not be submitted runs again later, budget intact
    assert asked.state == TrialState.FAIL and asked.user_attrs["retried"] and JOB_ATTR not in asked.user_attrs
    assert retry.state == TrialState.WAITING and retry.user_attrs["retry_of"] == asked.number
    assert retry.system_attrs["fixed_params"] == asked.params


def test_preempted_worker_requeues_and_reattaches_its_trial_job(tmp_path: Path, profile: Path, cli: Cli,
                                                                killed_promptly: None) -> None:
    """A worker signalled as SLURM preempts (or times out) a job requeues itself; the new run of the
    same array task finds its trial by its SLURM job id and follows the same trial job to the end."""
    url = created_study(cli, tmp_path, steps=HELD_RUN_STEPS, trials=1, references=NO_REFERENCES, hooks=HELD)
    out = cli("study", "launch", "tiny", "--workers", "1", "--launcher", str(profile), "--storage", url,
              "--no-tracking", cwd=tmp_path).stdout  # the tracked workers: test_study_launch_runs_the_budget...
    worker_id = re.search(r"SLURM job\(s\) (\d+)\n", out)[1]  # type: ignore[index]  # one body: no array
    trial = wait_for(lambda: held_trial(url), JOB_TIMEOUT_S, "a trial's job training")
    job_id, first_pid = trial.user_attrs[JOB_ATTR]["record"], trial.system_attrs[WORKER_ATTR]["pid"]
    folder = tmp_path / "runs" / "studies" / "tiny" / "workers"
    preempt(attach(worker_id, folder))  # submitit requeues the worker
    worker_log = folder / f"{worker_id}_0_log.out"
    wait_for(lambda: f"re-attached to SLURM job {job_id}" in worker_log.read_text(), 2 * JOB_TIMEOUT_S,
             "the requeued worker to re-attach the trial job")
    release(run_dir(trial))  # only now may the trial job end: the requeued worker follows it to its end
    wait_for(lambda: sacct_states(worker_id)[-1:] == ["COMPLETED"], 2 * JOB_TIMEOUT_S, "the worker")

    assert sacct_states(worker_id) == ["REQUEUED", "COMPLETED"]
    trials = trials_of(url)
    assert [(t.number, t.state) for t in trials] == [(trial.number, TrialState.COMPLETE)]
    assert trials[0].user_attrs[JOB_ATTR]["record"] == job_id and sacct_states(job_id) == ["COMPLETED"]
    owner = trials[0].system_attrs[WORKER_ATTR]
    assert owner["slurm_job"] == worker_id and owner["pid"] != first_pid  # followed by the requeued worker
    assert f"re-attached to SLURM job {job_id}\n" in worker_log.read_text()  # still training: no "(ended"


def test_study_stop_cancels_the_workers_then_the_trial_jobs(tmp_path: Path, profile: Path, cli: Cli,
                                                            killed_promptly: None) -> None:
    """Workers placed by the profile's `worker:` section run beside their trials; a layout whose workers
    could hold every node a trial needs is refused (sinfo). `study stop` mid-trial: the worker array goes
    first (no worker asks a trial as its trial job dies), then every trial job; the stopped trials are
    re-enqueued; nothing is RUNNING and no job of the study is left in squeue."""
    url = created_study(cli, tmp_path, steps=HELD_RUN_STEPS, trials=4, references=NO_REFERENCES, hooks=HELD)  # held till cancelled
    fields = yaml.safe_load(profile.read_text())
    blocking = tmp_path / "blocking.yaml"  # trials need 2 of each node's 4 CPUs; 3-CPU workers leave 1
    blocking.write_text(yaml.safe_dump({**fields, "cpus_per_task": 2, "worker": {"cpus": 3}}))
    refused = cli("study", "launch", "tiny", "--workers", "2", "--launcher", str(blocking), "--storage", url,
                  "--dry-run", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "2 worker(s) of 3 CPU(s) on the nodes of debug can keep every trial from starting" in refused.stderr
    one = cli("study", "launch", "tiny", "--workers", "1", "--launcher", str(blocking), "--storage", url,
              "--dry-run", cwd=tmp_path, check=False)  # one worker still blocks a node: no "fewer workers"
    assert one.returncode == 2 and len(one.stderr.splitlines()) == 1, one.stderr
    assert one.stderr.strip().endswith(  # the cluster has one partition: the login node is the way
        f"CPUs): run the study from this login node instead: `abtune study run tiny --launcher {blocking}` "
        "(every trial a SLURM job, no worker job)"), one.stderr
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text(yaml.safe_dump({**fields, "worker": {"partition": "cpu"}}))
    missing = cli("study", "launch", "tiny", "--workers", "1", "--launcher", str(nowhere), "--storage", url,
                  "--dry-run", cwd=tmp_path, check=False)
    assert (missing.returncode, missing.stderr) == (2, "abtune: error: worker.partition: cpu is not a partition of "
                                                       "this cluster (sinfo lists debug); set one of them in the "
                                                       "launcher profile\n")
    profile.write_text(yaml.safe_dump({**fields, "worker": {"partition": "debug", "time_limit": "0:20:00"}}))
    launch = ("study", "launch", "tiny", "--workers", "2", "--launcher", str(profile), "--storage", url)
    dry = cli(*launch, "--dry-run", cwd=tmp_path).stdout
    assert dry.count("#SBATCH --time=20\n") == 1 and dry.count("#SBATCH --time=60\n") == 1  # workers, trial

    out = cli(*launch, cwd=tmp_path).stdout
    match = re.search(r"SLURM job\(s\) (\d+)_0 \1_1\n", out)
    assert match, out
    worker_ids = [f"{match[1]}_0", f"{match[1]}_1"]
    started = wait_for(lambda: held_trial(url), JOB_TIMEOUT_S, "a trial's job training")
    status = cli("study", "status", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert re.search(rf"running: trial {started.number} in SLURM job {started.user_attrs[JOB_ATTR]['record']} on .*"
                     r"since [\d:]+: (RUNNING|COMPLETING)\n", status), status

    said = cli("study", "stop", "tiny", "--storage", url, cwd=tmp_path).stdout
    assert "cancelled worker job(s) " in said and all(w in said for w in worker_ids), said
    trials = trials_of(url)
    stopped = [t for t in trials if t.user_attrs.get("fail_reason") == STOPPED]
    assert stopped and not running(url)
    for trial in stopped:
        job_id = trial.user_attrs[JOB_ATTR]["record"]
        assert f"trial {trial.number}: SLURM job {job_id} cancelled, failed and re-enqueued" in said, said
        assert sacct_states(job_id)[-1] == "CANCELLED"
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in waiting) == [t.number for t in stopped]
    assert len(trials) == 2 * len(stopped)  # no trial asked after the stop
    queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], check=True, capture_output=True, text=True,
                           timeout=30).stdout.split()
    assert not set(queue) & {*worker_ids, *(t.user_attrs[JOB_ATTR]["record"] for t in stopped)}, queue


def _check_one_child_run_per_trial(tracking: str, trials: list) -> None:
    """The workers, on the compute nodes, logged every trial as a child of the study's one parent run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    parents = [r for r in runs if r.data.tags.get("abtune.role") == "study"]
    assert len(parents) == 1, [r.data.tags for r in runs]
    children = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    for trial in trials:
        child = children[trial.user_attrs["mlflow_run_id"]]
        assert child.info.status == "FINISHED" and child.data.params["launcher"] == "slurm"
        assert child.data.metrics["final_top1"] == trial.values[0]
