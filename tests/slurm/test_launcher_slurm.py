"""abtune's SLURM launcher on the real two-node cluster (fixture in conftest.py): an AB run whose
groups stay inside a node, a cancelled job, and a preempted or requeued job that resumes."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import submitit
import yaml
from submitit.slurm.slurm import SlurmJobEnvironment

from abtune.config import load_run_config
from abtune.launch.base import Layout
from abtune.launch.launchers import load_launcher, load_profile, reattach
from abtune.launch.slurm import SlurmJob, in_queue, job_folder, submit, submit_array
from abtune.launch.slurm import outcome as outcome_of
from abtune.rundir import prepare_run_dir
from abtune.runfiles import read_summary
from abtune.training.hooks import read_metrics, write_hook_specs
from tests.conftest import CliResult, abtune_command, wait_for, with_checkout_on_path, write_config
from tests.gate import gate_spec, paused, release
from tests.study_helpers import trials_of, write_study

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # slow too: `-m "not slow"` is the quick subset

JOB_TIMEOUT_S = 300


def cluster_profile(folder: Path, partition: str, tasks_per_node: int) -> Path:
    """A launcher profile for 2 nodes of the test cluster, 1 CPU per rank; more than 10 minutes (see
    profiles.MIN_TIME_LIMIT_MIN)."""
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump({"kind": "slurm", "partition": partition, "nodes": 2,
                                    "tasks_per_node": tasks_per_node, "cpus_per_task": 1, "time_limit": "1:00:00"}))
    return path


@pytest.fixture
def profile(slurm_cluster, tmp_path: Path) -> Path:
    """2 nodes x 2 ranks: AB's groups of 2 stay inside a node."""
    return cluster_profile(tmp_path, slurm_cluster.partition, tasks_per_node=2)


def one_rank_per_node(profile: Path) -> Path:
    """The profile's 2 nodes with 1 rank each, for a test whose point is not AB's groups: every rank a job
    starts costs seconds of CPU (Python, torch) on this 2-core machine."""
    two_ranks = profile.with_name("two.yaml")
    two_ranks.write_text(profile.read_text().replace("tasks_per_node: 2", "tasks_per_node: 1"))
    return two_ranks


def ab_config(tmp_path: Path, steps: int, **train: int) -> Path:
    return write_config(tmp_path / "ab.yaml", method={"name": "ab"},
                        train={"steps": steps, "eval_every": steps, "log_every": 10, **train})


def prepared_run(config: Path, run_dir: Path) -> Path:
    return prepare_run_dir(load_run_config(config), run_dir, resume=False)


def preempt(job: submitit.Job) -> None:
    """Preempt a running job the way submitit's own tests do, SIGTERM then the preemption signal (USR2),
    but in order. Sent back to back, slurmd delivered the TERM after the USR2 in CI, and it also killed
    the `scontrol requeue` that task 0 runs in its USR2 handler: the job never came back. So USR2 goes
    once task 0 has logged that it let the SIGTERM pass, as submitit does on preemption. (Only task 0:
    the others may be waiting in a collective, inside C++, where no Python signal handler runs.)"""
    log = job.paths.folder / f"{job.job_id}_0_log.out"
    assert log.exists(), f"job {job.job_id} has no task 0 log in {job.paths.folder}"
    subprocess.run(["scancel", job.job_id, "--signal", "SIGTERM"], check=True, timeout=30)
    wait_for(lambda: "Bypassing signal SIGTERM" in log.read_text(), 60, "task 0 to pass SIGTERM")
    subprocess.run(["scancel", job.job_id, "--signal", SlurmJobEnvironment.USR_SIG], check=True, timeout=30)


def sacct_states(job_id: str) -> list[str]:
    """Every record of the job, requeued attempts included."""
    out = subprocess.run(["sacct", "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", "State"],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_ab_groups_stay_inside_a_node(tmp_path: Path, profile: Path, abtune_main: Callable[..., CliResult]) -> None:
    config = ab_config(tmp_path, steps=60)
    run_dir = tmp_path / "run"
    result = abtune_main("train", str(config), "--launcher", str(profile), "--run-dir", str(run_dir), "--no-tracking")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("submitted SLURM job ")
    assert "final top-1" in result.stdout

    summary = read_summary(run_dir).raw
    assert (summary["world_size"], summary["num_nodes"], summary["ranks_per_node"]) == (4, 2, 2)
    assert summary["groups"] == {"group_size": 2, "num_groups": 2, "a_ranks": [0, 1], "b_ranks": [2, 3]}
    assert summary["steps_done"] == 60
    by_phase = summary["traffic"]["by_phase"]
    assert by_phase["warmup"]["inter"]["mean"] > 0  # the nodes are real to the meter: DDP crosses them
    assert by_phase["ab"]["total"]["mean"] > 0
    decompositions = len(summary["decompositions"])
    for rows in summary["traffic"]["rows_per_rank"]:
        ab = [r for r in rows if r["phase"] == "ab"]
        assert {r["locality"] for r in ab if r["group"].startswith("ab_group")} == {"intra"}
        # The only bytes of the AB phase that leave a node: each decomposition's rank agreement,
        # one MAX all-reduce of an int64 per factored weight, over the world.
        inter = [r for r in ab if r["locality"] == "inter"]
        assert [(r["group"], r["op"], r["calls"]) for r in inter] == [("world", "all_reduce", decompositions)]
        # The agreement covers every eligible weight, also those the rank cap then leaves full rank.
        first = summary["decompositions"][0]
        weights = len(first["ranks"]) + len(first["kept_full_rank"])
        assert weights > 0
        assert inter[0]["payload_bytes"] == decompositions * weights * 8


def test_cancelled_job_fails_with_the_slurm_state(tmp_path: Path, profile: Path, killed_promptly: None) -> None:
    config = ab_config(tmp_path, steps=100_000)
    run_dir = tmp_path / "run"
    command = [*abtune_command(), "train", str(config), "--launcher", str(one_rank_per_node(profile)),
               "--run-dir", str(run_dir), "--no-tracking"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as cli:
        first = cli.stdout.readline() if cli.stdout else ""
        assert first.startswith("submitted SLURM job "), first
        job_id = first.split()[3].rstrip(":")
        wait_for(lambda: bool(read_metrics(run_dir)), JOB_TIMEOUT_S, "the run to train")
        # What a rank that outlives its killed peer for a moment writes (seen in CI): an echo of the
        # cancellation, which must not be given as its cause.
        (run_dir / "failures").mkdir(exist_ok=True)
        (run_dir / "failures" / "crash_rank_1.txt").write_text("rank 1: RuntimeError: Connection reset by peer")
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        _, stderr = cli.communicate(timeout=JOB_TIMEOUT_S)

    assert cli.returncode == 1
    assert stderr.strip().splitlines() == [
        f"abtune: error: SLURM job {job_id} CANCELLED (run folder {run_dir}; no checkpoint to resume from)"
    ]
    # what a study runner sees when it re-attaches to the trial's job later
    job = reattach("slurm", job_id, run_dir)
    result = job.poll() if job is not None else None
    assert result is not None and (result.ok, result.reason) == (False, f"SLURM job {job_id} CANCELLED")


def test_detached_and_unfollowed_jobs_keep_running_and_say_how_to_reach_them(
        tmp_path: Path, profile: Path, abtune_main: Callable[..., CliResult], killed_promptly: None) -> None:
    """`--detach` returns once the job is submitted, naming squeue; Ctrl-C while following stops only the
    following, naming scancel; both jobs run on (the detached one to its summary)."""
    config = write_config(tmp_path / "ddp.yaml", train={"steps": 20, "log_every": 10})
    detached = tmp_path / "detached"
    detach = abtune_main("train", str(config), "--launcher", str(one_rank_per_node(profile)), "--run-dir",
                         str(detached), "--detach", "--no-tracking")
    assert detach.returncode == 0, detach.stderr
    out = detach.stdout.splitlines()
    job_id = out[0].split()[3].rstrip(":")
    assert out == [f"submitted SLURM job {job_id}: 2 node(s) x 1 rank(s), run folder {detached}, "
                   f"logs {detached / 'jobs'}",
                   f"follow with: squeue -j {job_id}; the result appears in {detached / 'summary.json'}"]

    endless = write_config(tmp_path / "endless.yaml", train={"steps": 100_000, "log_every": 10})
    command = [*abtune_command(), "train", str(endless), "--launcher", str(one_rank_per_node(profile)),
               "--run-dir", str(tmp_path / "followed"), "--no-tracking"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as cli:
        first = cli.stdout.readline() if cli.stdout else ""
        followed = first.split()[3].rstrip(":")
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=JOB_TIMEOUT_S)
    assert cli.returncode == 130
    assert stderr.splitlines() == [
        f"abtune: stopped following; SLURM job {followed} keeps running (scancel {followed} stops it)"]
    assert in_queue(followed)  # the job itself was not touched
    subprocess.run(["scancel", followed], check=True, timeout=30)
    wait_for(lambda: (detached / "summary.json").exists(), JOB_TIMEOUT_S, "the detached run's summary")
    wait_for(lambda: sacct_states(job_id)[-1] == "COMPLETED", JOB_TIMEOUT_S, "the detached job to complete")


def test_failed_rank_ends_the_job_with_its_cause(tmp_path: Path, profile: Path,
                                                abtune_main: Callable[..., CliResult]) -> None:
    """One rank's error ends the whole job at once (srun --kill-on-bad-exit), reported with the SLURM state."""
    config = write_config(tmp_path / "nan.yaml", optimizer={"name": "sgd", "lr": 1e30, "momentum": 0.0},
                          train={"steps": 1000})
    result = abtune_main("train", str(config), "--launcher", str(one_rank_per_node(profile)), "--run-dir",
                         str(tmp_path / "run"), "--no-tracking")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"abtune: error: SLURM job \d+ FAILED: the loss became nan at step \d+ .*",
                                            lines[0]), result.stderr


def _task_pid(job_id: str, task: int) -> int | None:
    """The process of one task of a job on this machine's slurmd nodes, by the environment slurmd started it with."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={task}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and wanted <= environ and b"submitit.core._submit" in command:
            return int(proc.name)
    return None


def test_a_frozen_rank_gets_its_job_ended_by_a_peer_not_its_time_limit(tmp_path: Path, profile: Path) -> None:
    """A rank frozen mid-run on node n2 (SIGSTOP, as a hung GPU or a stalled node) leaves its peer waiting in DDP's
    all-reduce; the peer's hang detector ends its task at its 3 s floor, srun ends the job, and the one line names
    the frozen rank and its node (SLURM's name for it, the one to drain), then the rank that waited, well before
    the job's hour or the process group's 600 s."""
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000, "eval_every": 100000, "log_every": 10,
                                                         "hang": {"floor_s": 3, "untimed_s": 120}})
    run_dir = prepared_run(config, tmp_path / "run")
    job = load_launcher(str(one_rank_per_node(profile))).submit(run_dir, Layout(2, 1))
    assert isinstance(job, SlurmJob)
    wait_for(lambda: any(r["kind"] == "log" for r in read_metrics(run_dir)) if (run_dir / "metrics.jsonl").exists()
             else False, JOB_TIMEOUT_S, "the run to train")
    pid = _task_pid(job.job_id, 1)
    assert pid is not None, "rank 1's process"
    os.kill(pid, signal.SIGSTOP)
    try:
        outcome = job.wait(poll_s=0.5)
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)
    assert not outcome.ok and outcome.reason is not None
    assert re.fullmatch(r"SLURM job \d+ FAILED: rank 1 \(node 1, host n2\) stopped responding: not heard from for \d+ "
                        r"s, last [^;]+; rank 0 \(node 0, host n1\) made no progress for \d+ s in step \d+ \(phase "
                        r"train\), not in a collective \(the last it issued: all_reduce over group 'world' .*",
                        outcome.reason), outcome.reason  # the peer's hang detector, not a time limit, ended it
    wait_for(lambda: not in_queue(job.job_id), 60, "the job to leave the queue")


def test_interrupted_job_resumes_from_its_checkpoint(tmp_path: Path, profile: Path, monkeypatch: pytest.MonkeyPatch,
                                                    killed_promptly: None) -> None:
    """Interrupted twice, then completes: first preempted the way submitit sees it (rank 0 calls
    checkpoint() and requeues), then requeued by SLURM itself (`scontrol requeue`: the job restarts
    as first submitted, and SLURM_RESTART_COUNT tells it to resume). Same job, same run folder."""
    # Each interruption comes while rank 0 is held at a gate (tests/gate.py), so the run cannot end before it
    # whatever the machine's speed, and each resume step is known: the gate at step 15 holds once checkpoint
    # 10 is complete, the one at step 35 once 30 is. ddp: what is tested here is the job's requeue (AB's
    # resume is tested in tests/test_resume_after_sync.py).
    steps = 50
    config = write_config(tmp_path / "ddp.yaml", train={"steps": steps, "eval_every": steps, "log_every": 5,
                                                        "checkpoint_every": 10})
    run_dir = prepared_run(config, tmp_path / "run")
    write_hook_specs(run_dir, [gate_spec(15, "first"), gate_spec(35, "second")])
    monkeypatch.setenv("PYTHONPATH", with_checkout_on_path(os.environ)["PYTHONPATH"])  # the ranks import the gate
    job = load_launcher(str(profile)).submit(run_dir, Layout(2, 1))  # 2 ranks: half the start-up cost of 4
    assert isinstance(job, SlurmJob)
    log = job_folder(run_dir) / f"{job.job_id}_0_log.out"

    wait_for(lambda: paused(run_dir, "first"), JOB_TIMEOUT_S, "rank 0 at step 15")
    preempt(job.submitit_job)
    wait_for(lambda: len(resumed_at(log, run_dir)) == 1, JOB_TIMEOUT_S, "the first resume")
    release(run_dir, "first")  # the requeued job's rank 0 trains on past step 15
    wait_for(lambda: paused(run_dir, "second"), JOB_TIMEOUT_S, "rank 0 at step 35")
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=30)
    wait_for(lambda: len(resumed_at(log, run_dir)) == 2, JOB_TIMEOUT_S, "the second resume")
    release(run_dir, "second")
    result = job.wait(poll_s=0.5)

    assert result.ok, result
    assert read_summary(run_dir).raw["steps_done"] == steps
    assert resumed_at(log, run_dir) == [10, 30]  # the newest complete checkpoint each time
    steps_logged = [r["step"] for r in read_metrics(run_dir) if r["kind"] == "log"]
    assert steps_logged == list(range(5, steps + 1, 5))  # the count continues: no step twice, none missing
    wait_for(lambda: sacct_states(job.job_id)[-1] == "COMPLETED", 30, "sacct to record COMPLETED")
    assert sacct_states(job.job_id) == ["REQUEUED", "REQUEUED", "COMPLETED"]


def resumed_at(log: Path, run_dir: Path) -> list[int]:
    """Steps rank 0 resumed at, from its log. Rich wraps its notes at 80 columns there, turning a space
    into a line break or breaking inside the path, wherever the tmp path's length puts it; so compare
    without any whitespace."""
    text = re.sub(r"\s+", "", log.read_text()) if log.exists() else ""
    pattern = rf"resumedfrom{re.escape(str(run_dir))}/checkpoints/step_\d+atstep(\d+)"
    return [int(step) for step in re.findall(pattern, text)]




def test_unknown_partition_is_one_line(tmp_path: Path, profile: Path, abtune_main: Callable[..., CliResult]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(profile.read_text().replace("partition: debug", "partition: nosuchpart"))
    result = abtune_main("train", str(ab_config(tmp_path, steps=10)), "--launcher", str(bad),
                         "--run-dir", str(tmp_path / "run"))
    assert (result.returncode, result.stderr) == (
        2, "abtune: error: partition: nosuchpart is not a partition of this cluster (sinfo lists debug); set one of "
           "them in the launcher profile\n")
    assert not (tmp_path / "run").exists()



def test_a_profile_the_cluster_cannot_hold_is_refused_in_one_line_at_dry_run_and_submission(
        tmp_path: Path, profile: Path, abtune_main: Callable[..., CliResult]) -> None:
    """4 nodes of a 2-node partition (sinfo tells; 4 so that AB's study finds its groups even): `train` and `train
    --dry-run` refuse it in one line and submit nothing, and `study launch` refuses it without recommending
    `study run`, which would wait the same way."""
    four = tmp_path / "four.yaml"
    four.write_text(profile.read_text().replace("nodes: 2", "nodes: 4"))
    config = write_config(tmp_path / "ddp.yaml", train={"steps": 10})
    expected = ("abtune: error: launcher profile: nodes 4, but partition debug has 2 node(s) (n1, n2; sinfo); "
                "ask for at most 2\n")
    queued_before = _my_jobs()
    for dry_run in (["--dry-run"], []):
        result = abtune_main("train", str(config), "--launcher", str(four), "--run-dir", str(tmp_path / "run"),
                             "--no-tracking", *dry_run)
        assert (result.returncode, result.stderr, result.stdout) == (2, expected, "")
    assert not (tmp_path / "run").exists() and _my_jobs() == queued_before
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert abtune_main("study", "create", str(write_study(tmp_path / "s.yaml")), "--storage", url).returncode == 0
    for command in (["launch", "--dry-run"], ["run"]):
        refused = abtune_main("study", command[0], "tiny", "--launcher", str(four), "--storage", url, "--no-tracking",
                              *command[1:], cwd=tmp_path)
        assert (refused.returncode, refused.stderr) == (2, expected), refused.stderr
    assert {t.state.name for t in trials_of(url)} == {"WAITING"}  # the references, never asked for
    # One that got past the check (the partition shrank since, an older abtune) pends for PartitionNodeLimit (which
    # also means "nodes down" and may clear: with more nodes than the partition has, it never does), then for
    # PartitionConfig once the scheduler has looked at it.
    job = submit(prepared_run(config, tmp_path / "past"), Layout(4, 2), load_profile(str(four)))
    outcome = wait_for(lambda: outcome_of(job, tmp_path / "past"), JOB_TIMEOUT_S, "the job to be given up")
    assert (outcome.ok, outcome.never_started) == (False, True)
    assert re.fullmatch(rf"SLURM job {job.job_id} can never start: it pends for (PartitionNodeLimit \(it asks 4 "
                        r"node\(s\); partition debug has 2\)|PartitionConfig \(the partition's configuration cannot "
                        r"hold it\)); cancelled it: fix the launcher profile", outcome.reason or ""), outcome.reason
    wait_for(lambda: not in_queue(job.job_id), 60, "the job to leave the queue")


def _my_jobs() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True,
                          timeout=30).stdout.split()


def test_a_job_pending_for_a_reason_that_cannot_clear_is_cancelled_and_fails_in_one_line(
        tmp_path: Path, profile: Path, slurm_cluster) -> None:
    """The run's job waits behind another that holds both nodes; then the partition's time limit drops below
    the job's hour: SLURM keeps it PENDING (PartitionTimeLimit) for ever. `train` cancels it and says why."""
    hold = subprocess.run(["sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 600"], capture_output=True,
                          text=True, check=True, timeout=30, cwd=tmp_path).stdout.strip()
    limit = ["scontrol", "update", f"PartitionName={slurm_cluster.partition}"]
    run_dir = tmp_path / "run"
    command = [*abtune_command(), "train", str(ab_config(tmp_path, steps=10)), "--launcher", str(profile),
               "--run-dir", str(run_dir), "--no-tracking"]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = cli.stdout.readline() if cli.stdout else ""
        assert first.startswith("submitted SLURM job "), first
        job_id = first.split()[3].rstrip(":")
        wait_for(lambda: "Resources" in _reason(job_id), JOB_TIMEOUT_S, "the job to wait for the nodes")
        subprocess.run([*limit, "MaxTime=30"], check=True, timeout=30)
        _, stderr = cli.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        cli.kill()  # only if it still follows a job that never starts
        subprocess.run([*limit, "MaxTime=INFINITE"], check=True, timeout=30)
        subprocess.run(["scancel", hold], check=True, timeout=30)
    assert cli.returncode == 2, stderr
    assert stderr == (f"abtune: error: SLURM job {job_id} can never start: it pends for PartitionTimeLimit (its time "
                      "limit exceeds the partition's); cancelled it: fix the launcher profile\n")
    wait_for(lambda: not in_queue(job_id), 60, "the job to leave the queue")


def _reason(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%r"], capture_output=True, text=True,
                          timeout=30).stdout


def test_a_detached_run_s_mlflow_run_is_closed_however_its_job_ends(
        tmp_path: Path, profile: Path, mlflow_db: Path, abtune_main: Callable[..., CliResult]) -> None:
    """`train --detach` follows nothing, so the job's own closer (a one-task job that runs after it, however it
    ended) tells MLflow as `train` following it would: a run that trains to the end FINISHED with its results, one
    cancelled while it waited for nodes FAILED; one that sbatch refused FAILED at once. None stays RUNNING."""
    from mlflow import MlflowClient

    tracking = ["--tracking-uri", f"sqlite:///{mlflow_db}"]
    config = write_config(tmp_path / "ddp.yaml", train={"steps": 20, "log_every": 10, "eval_every": 20})
    refused = tmp_path / "refused.yaml"
    refused.write_text(profile.read_text() + "sbatch: {constraint: nosuchfeature}\n")  # sinfo cannot tell
    result = abtune_main("train", str(config), "--launcher", str(refused), "--run-dir", str(tmp_path / "refused"),
                         "--detach", *tracking)
    assert result.returncode == 2 and "sbatch refused the job" in result.stderr, result.stderr
    hold = subprocess.run(["sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 600"], capture_output=True,
                          text=True, check=True, timeout=30, cwd=tmp_path).stdout.strip()
    two_ranks = one_rank_per_node(profile)
    try:
        jobs = {}
        for name in ("cancelled", "finished"):
            detach = abtune_main("train", str(config), "--launcher", str(two_ranks), "--run-dir", str(tmp_path / name),
                                 "--detach", *tracking)
            assert detach.returncode == 0, detach.stderr
            jobs[name] = detach.stdout.split()[3].rstrip(":")
        subprocess.run(["scancel", jobs["cancelled"]], check=True, timeout=30)
    finally:
        subprocess.run(["scancel", hold], check=True, timeout=30)
    client = MlflowClient(f"sqlite:///{mlflow_db}")

    def ended() -> dict[str, str] | None:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        states = {run.data.tags.get("abtune.run_dir", "").rpartition("/")[2]: run.info.status for run in runs}
        return states if "RUNNING" not in states.values() and len(states) == 3 else None

    states = wait_for(ended, JOB_TIMEOUT_S, "every MLflow run to end")
    assert states == {"refused": "FAILED", "cancelled": "FAILED", "finished": "FINISHED"}, states
    finished = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  filter_string="attributes.status = 'FINISHED'")[0]
    assert finished.data.metrics["final_top1"] == read_summary(tmp_path / "finished").final_top1


def test_job_array_for_study_workers(tmp_path: Path, profile: Path) -> None:
    """What `abtune study launch N --workers W` builds on: W bodies, one array, back at once with the ids."""
    jobs = submit_array(tmp_path / "workers", Layout(1, 1), load_profile(str(profile)),
                        [functools.partial(os.getenv, "SLURM_ARRAY_TASK_ID") for _ in range(2)], "abtune-workers")
    array_id = jobs[0].job_id.split("_")[0]
    assert [job.job_id for job in jobs] == [f"{array_id}_0", f"{array_id}_1"]
    wait_for(lambda: all(job.done(force_check=True) for job in jobs), JOB_TIMEOUT_S, "the array")
    assert [job.result() for job in jobs] == ["0", "1"]
    script = (tmp_path / "workers" / f"{array_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --ntasks-per-node=1" in script
