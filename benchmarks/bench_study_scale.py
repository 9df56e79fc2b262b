"""A study at cluster scale on real parts (issue 25): one table row per invocation.

    python benchmarks/bench_study_scale.py --workers W --trials T [--steps 4] [--repo PATH]
                                           [--nodes 16] [--port-base 7817] [--out /tmp/scale]
                                           [--pg-max-connections 400] [--probe-every 3] [--timeout-min 60]

One row brings up, all under OUT/wW-tT-STAMP/ (kept: logs, trial folders) and all stopped at the end (also
on Ctrl-C or an error):
- a SLURM cluster of `--nodes` virtual nodes (tests/slurm/cluster.sh, ABTUNE_SLURM_NODES, own port base);
- a throw-away PostgreSQL server (tests/postgres/server.py): database `abtune` holds the Optuna study,
  database `mlflow` the MLflow store (psycopg2, the driver the storage uses too), restarted with
  `--pg-max-connections` (pg.sh sets 60; 16 workers exhausted them);
- logging shims for squeue, sacct, sbatch, scancel, sinfo and scontrol first in PATH for `study launch`
  and, through sbatch's --export=ALL and the profile's setup line, for its workers and their trial jobs.

It creates study `scale` (the quickstart model, `--steps` steps, 1 rank, method ab-nogroups, objective
top1, TPE, no reference trials, budget T) and runs `abtune study launch scale --workers W --launcher
PROFILE` (one trial = one SLURM job of 1 node x 1 task) with the python and PYTHONPATH of `--repo`
(default: this checkout), so a checkout before and after a change can be measured alike. Measured:
- slurmctld RPCs by type (`sdiag -r` before the launch, `sdiag` once every worker has ended) and slurmdbd
  RPCs by type (`sacctmgr clear stats` / `sacctmgr show stats`), per trial job;
- command invocations from the shims' log, per trial job and per worker-minute (worker jobs' elapsed time
  from one `sacct` at the end, after the RPC counters were read);
- storage latency: a probe process every `--probe-every` s does ask + suggest + tell of a throw-away trial
  on study `probe` in the same database (RandomSampler: the storage's time) and records the real study's
  finished trials and PostgreSQL's client connections at that moment; it reads the real study's trials as
  a sampler does (`get_all_trials`) at most a tenth of its time (READ_SHARE);
- the stores' work as PostgreSQL counts it (pg_stat_database before the launch and after the workers):
  transactions, milliseconds executing statements, rows read and written, per trial job, for the
  Optuna database (the probe's study included) and MLflow's;
- CPU seconds: the profile's `python:` is a wrapper logging each worker's and trial job's CPU (bash `times`:
  the process and the children it waited for, sbatch/squeue/sacct included); daemons' from /proc;
- `abtune study status`, `study best`, `study export --format json` wall time at the end;
- the MLflow experiment page: `abtune ui`'s experiment link rendered in headless chromium (tests/browser.py;
  wall time of the dump, rows in the grid), and MLflow's search of the experiment's runs through the REST API;
- lost trials (T minus COMPLETE/PRUNED; in a row stopped early by --timeout-min or `touch ROW/STOP`, which
  then runs `abtune study stop`: FAIL trials nobody retried and trials left RUNNING), failed trials, and
  duplicated trials (a trial folder with more
  than one job result, more than one summary record or a step logged twice, or a trial number with more
  than one COMPLETED SLURM job).
It prints the table row and writes OUT/wW-tT-STAMP/result.json (every number, `uptime` before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))  # tests.postgres, tests.browser

import sqlalchemy as sa  # noqa: E402

from tests.postgres import server as postgres  # noqa: E402

CLUSTER_SH = HERE / "tests" / "slurm" / "cluster.sh"
STUDY = "scale"
PROBE_STUDY = "probe"
SHIMMED = ("squeue", "sacct", "sbatch", "scancel", "sinfo", "scontrol")
SLURM_BIN = "/usr/bin"
FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")
READ_SHARE = 0.1  # the probe's full read of the real study: at most this share of the probe's time
PG_STATS_FLUSH_S = 12  # PostgreSQL 15 flushes an idle session's statistics within 10 s
TRIAL_STATES = sa.text("SELECT t.state, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                       "WHERE s.study_name = :name GROUP BY t.state")


# --- parts: cluster, database, shims ---------------------------------------------------------
def run_logged(args: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 600) -> None:
    """Run with output appended to `log` (daemons it starts must not hold a pipe of ours)."""
    with log.open("a") as fh:
        fh.write(f"$ {shlex.join(args)}\n")
        fh.flush()
        rc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                            timeout=timeout).returncode
    if rc != 0:
        raise RuntimeError(f"`{shlex.join(args)}` failed (rc={rc}); see {log}")


def cluster_env(args: argparse.Namespace, state: Path) -> dict[str, str]:
    return {**os.environ, "ABTUNE_SLURM_NODES": str(args.nodes), "ABTUNE_SLURM_PORT_BASE": str(args.port_base),
            "SLURM_CONF": str(state / "etc" / "slurm.conf")}


def cluster(command: str, args: argparse.Namespace, state: Path) -> None:
    run_logged(["bash", str(CLUSTER_SH), command, str(state)], state.parent / "cluster-sh.log",
               cluster_env(args, state))


def postgres_up(state: Path, max_connections: int) -> postgres.PostgresServer:
    """tests/postgres/pg.sh's server, restarted with more connections than its 60 (16 workers, their trial
    jobs' rank 0 and MLflow's pools need more; appended to postgresql.auto.conf: the last setting wins)."""
    postgres.up(state)
    with (state / "data" / "postgresql.auto.conf").open("a") as fh:
        fh.write(f"max_connections = {max_connections}  # bench_study_scale.py\n")
    postgres.down(state)
    return postgres.up(state)


def create_database(admin_url: str, name: str) -> None:
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))


def write_shims(folder: Path, log: Path) -> Path:
    """One script per command: append `EPOCH PID COMMAND ARGS` to `log`, then exec the real binary."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHIMMED:
        shim = folder / name
        shim.write_text(f'#!/bin/sh\necho "$(date +%s.%N) $$ {name} $*" >> {shlex.quote(str(log))}\n'
                        f'exec {SLURM_BIN}/{name} "$@"\n')
        shim.chmod(0o755)
    return folder


def write_timed_python(path: Path, python: str, log: Path) -> Path:
    """The profile's `python:` for workers and trial jobs: run the real python, then append the CPU seconds
    of it and every child it waited for (bash's `times`) and its submitit folder (worker or trial) to `log`."""
    # `times` in the shell itself: inside $(...) it would report the subshell's children, none
    own = f'{shlex.quote(str(log))}.$$'
    path.write_text(f'#!/bin/bash\n{shlex.quote(python)} "$@"\nrc=$?\ntimes > {own}\n'
                    f'echo "$(date +%s.%N) ${{@: -1}} $(tail -1 {own})" >> {shlex.quote(str(log))}\n'
                    f'rm -f {own}\nexit $rc\n')
    path.chmod(0o755)
    return path


def job_cpu(log: Path) -> dict[str, Any]:
    """CPU seconds (user + sys) of the trial jobs' and the workers' python processes, from the timed python."""
    cpu: dict[str, list[float]] = {"trial": [], "worker": []}
    for line in log.read_text().splitlines() if log.exists() else []:
        _, folder, user, system = line.split()
        kind = "worker" if folder.rstrip("/").endswith("workers") else "trial"
        cpu[kind].append(minutes_seconds(user) + minutes_seconds(system))
    return {f"{kind}_processes": len(v) for kind, v in cpu.items()} | \
        {f"{kind}_cpu_s": round(sum(v), 1) for kind, v in cpu.items()}


def live_worker_cpu(workers_folder: Path) -> float:
    """CPU seconds of the worker processes still running (a row stopped early: they never log their own)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if cmdline.read_bytes().rstrip(b"\0").endswith(str(workers_folder).encode()) and b"python" in cmdline.read_bytes():
                total += proc_cpu_ticks(int(cmdline.parent.name), waited=True)
    return round(total / tick, 1)


def minutes_seconds(text: str) -> float:
    minutes, seconds = text.rstrip("s").split("m")
    return 60 * float(minutes) + float(seconds)


def daemon_cpu(row: Path) -> dict[str, float]:
    """CPU seconds so far of the row's daemons (and PostgreSQL's backends, live and exited), from /proc."""
    pidfiles = {"slurmctld": row / "slurm/slurm/slurmctld.pid", "slurmdbd": row / "slurm/slurm/slurmdbd.pid",
                "mariadbd": row / "slurm/mysql/mysqld.pid", "postgres": row / "pg/data/postmaster.pid"}
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for name, pidfile in pidfiles.items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pidfile.read_text().split()[0])
            pids = [pid] + (children(pid) if name == "postgres" else [])
            cpu[name] = round(sum(proc_cpu_ticks(p, waited=(p == pid)) for p in pids) / tick, 1)
    return cpu


def proc_cpu_ticks(pid: int, waited: bool) -> int:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if waited else 0)
    return 0


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def shim_counts(log: Path, upto_line: int | None = None) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[2] for line in lines[:upto_line] if len(line.split()) > 2)


# --- the study ---------------------------------------------------------------------------------
def study_file(folder: Path, repo: Path, trials: int, steps: int) -> Path:
    import yaml

    study = {"name": STUDY, "base": str(repo / "studies" / "run_quickstart.yaml"),
             "overrides": {"method.name": "ab-nogroups", "train.steps": steps, "train.eval_every": steps,
                           "train.log_every": max(1, steps // 2)},
             "layout": {"nproc": 1, "ranks_per_node": 1},
             "space": {"method.warmup_frac": {"low": 0.1, "high": 0.3},
                       "method.sigma_cutoff": {"low": 0.04, "high": 0.3, "log": True}},
             "objectives": ["top1"], "sampler": {"name": "tpe", "seed": 0, "options": {"n_startup_trials": 10}},
             "pruner": {"name": "none"}, "references": {"paper_defaults": False, "ddp": False}, "trials": trials}
    path = folder / "scale.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def profile_file(folder: Path, workers: int, shims: Path, python: Path) -> Path:
    import yaml

    profile = {"kind": "slurm", "partition": "debug", "nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1,
               "time_limit": "2:00:00", "array_parallelism": workers, "python": str(python),
               "setup": [f"export PATH={shlex.quote(str(shims))}:$PATH"]}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def repo_python(repo: Path) -> str:
    venv = repo / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def abtune_env(repo: Path, state: Path, shims: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "PYTHONPATH": str(repo),
            "SLURM_CONF": str(state / "etc" / "slurm.conf"), "COLUMNS": "200"}


def abtune(repo: Path, env: dict[str, str], cwd: Path, *args: str, timeout: float = 600) -> tuple[float, str]:
    """Run `abtune ARGS` with the checkout's python; (wall seconds, stdout). Fails on a non-zero exit."""
    start = time.monotonic()
    done = subprocess.run([repo_python(repo), "-m", "abtune.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"abtune {args[:2]} failed (rc={done.returncode}): {done.stderr[-2000:]}")
    return time.monotonic() - start, done.stdout


# --- counters: sdiag, sacctmgr -----------------------------------------------------------------
RPC_LINE = re.compile(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)")


def rpcs_by_type(text: str) -> dict[str, int]:
    """The 'by message type' section of sdiag / sacctmgr show stats: {type: count}."""
    counts: dict[str, int] = {}
    in_types = False
    for line in text.splitlines():
        if "by message type" in line:
            in_types = True
        elif "by user" in line or "Pending RPC" in line:
            in_types = False
        elif in_types and (match := RPC_LINE.match(line)):
            counts[match[1]] = counts.get(match[1], 0) + int(match[2])
    return counts


def slurm_tool(env: dict[str, str], *args: str) -> str:
    return subprocess.run([f"{SLURM_BIN}/{args[0]}", *args[1:]], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def reset_counters(env: dict[str, str]) -> dict[str, int]:
    """Zero sdiag; clear slurmdbd's stats (its counts before are returned, in case clearing is refused)."""
    slurm_tool(env, "sdiag", "-r")
    before = rpcs_by_type(slurm_tool(env, "sacctmgr", "show", "stats"))
    with contextlib.suppress(subprocess.CalledProcessError):
        slurm_tool(env, "sacctmgr", "-i", "clear", "stats")
        before = rpcs_by_type(slurm_tool(env, "sacctmgr", "show", "stats"))
    return before


def read_counters(env: dict[str, str], dbd_before: dict[str, int]) -> dict[str, Any]:
    sdiag = slurm_tool(env, "sdiag")
    dbd = rpcs_by_type(slurm_tool(env, "sacctmgr", "show", "stats"))
    submitted = re.search(r"Jobs submitted:\s*(\d+)", sdiag)
    return {"slurmctld": rpcs_by_type(sdiag), "slurmdbd": {k: v - dbd_before.get(k, 0) for k, v in dbd.items()},
            "sdiag_jobs_submitted": int(submitted[1]) if submitted else None, "sdiag_text": sdiag}


def jobs_since(env: dict[str, str], start: str) -> list[dict[str, str]]:
    out = slurm_tool(env, "sacct", "-X", "-n", "-P", "--duplicates", "-S", start, "-o",
                     "JobID,JobName,State,ElapsedRaw")
    keys = ("id", "name", "state", "elapsed_s")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]


# --- the storage probe -------------------------------------------------------------------------
def probe(url: str, every_s: float, out: Path, stop: Any) -> None:
    """Until `stop` is set: ask + suggest + tell on the probe study every `every_s`, and a full read of the
    real one at most READ_SHARE of the time (at 1000 trials one read takes seconds: every 3 s, the probe
    itself would load the machine it measures)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name=PROBE_STUDY, storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    next_read = 0.0
    with out.open("a") as fh:
        while not stop.wait(every_s):
            read = time.monotonic() >= next_read
            try:
                sample = probe_once(storage, study, read)
            except Exception as error:  # a refused connection is a finding, not the end of the probe
                sample = {"t": time.time(), "error": str(error).splitlines()[0][:300]}
            if "read_real_ms" in sample:
                next_read = time.monotonic() + sample["read_real_ms"] / 1000 / READ_SHARE
            fh.write(json.dumps(sample) + "\n")
            fh.flush()


def probe_once(storage: Any, study: Any, read: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    t1 = time.perf_counter()
    study.tell(trial, 0.0)
    t2 = time.perf_counter()
    sample = {"t": time.time(), "ask_ms": 1000 * (t1 - t0), "tell_ms": 1000 * (t2 - t1),
              "pg_connections": pg_connections(storage)}
    with storage.engine.connect() as conn:
        counts = dict(conn.execute(TRIAL_STATES, {"name": STUDY}).all())
    sample["real_trials"] = sum(counts.values())
    sample["real_finished"] = sum(n for state, n in counts.items() if str(state) in FINISHED_STATES)
    if read:
        t3 = time.perf_counter()
        with contextlib.suppress(KeyError):
            storage.get_all_trials(storage.get_study_id_from_name(STUDY), deepcopy=False)
        sample["read_real_ms"] = 1000 * (time.perf_counter() - t3)
    return sample


DATABASE_STATS = sa.text(
    "SELECT datname, xact_commit + xact_rollback, active_time, tup_returned + tup_fetched, "
    "tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname IN ('abtune', 'mlflow')")


def database_stats(url: str) -> dict[str, dict[str, float]]:
    """Per database (`abtune`: the Optuna storage and the probe's study; `mlflow`: the MLflow store), as
    PostgreSQL counts it: transactions, milliseconds spent executing statements, rows read and written."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(DATABASE_STATS).all()
    keys = ("transactions", "active_ms", "rows_read", "rows_written")
    return {str(name): dict(zip(keys, map(float, values), strict=True)) for name, *values in rows}


def database_per_trial_job(before: dict[str, Any], after: dict[str, Any], trial_jobs: int) -> dict[str, Any]:
    return {name: {key: per(value - before.get(name, {}).get(key, 0.0), trial_jobs) for key, value in stats.items()}
            for name, stats in after.items()}


def pg_connections(storage: Any) -> int:
    with storage.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"))
                   .scalar())


def percentiles(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50": values[0] if values else None, "p99": values[0] if values else None, "n": len(values)}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p99": cuts[98], "n": len(values)}


def probe_summary(path: Path) -> dict[str, Any]:
    samples = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    rows = [r for r in samples if "error" not in r]
    by_tenth: dict[str, Any] = {}
    if rows:
        top = max(r["real_finished"] for r in rows) or 1
        for r in rows:  # latency against the study's size: buckets of a tenth of its final size
            bucket = str(min(9, 10 * r["real_finished"] // top))
            by_tenth.setdefault(bucket, []).append(r)
    return {"ask_ms": percentiles([r["ask_ms"] for r in rows]), "tell_ms": percentiles([r["tell_ms"] for r in rows]),
            "read_real_ms": percentiles([r["read_real_ms"] for r in rows if "read_real_ms" in r]),
            "by_finished": {k: {"finished": max(r["real_finished"] for r in v),
                                "ask_ms": percentiles([r["ask_ms"] for r in v]),
                                "read_real_ms": percentiles([r["read_real_ms"] for r in v if "read_real_ms" in r])}
                            for k, v in sorted(by_tenth.items(), key=lambda kv: int(kv[0]))},
            "pg_connections_max": max((r["pg_connections"] for r in rows), default=None),
            "errors": [r for r in samples if "error" in r], "samples": rows}


# --- waiting for the workers -------------------------------------------------------------------
def trial_states(url: str) -> Counter[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        return Counter({str(state): n for state, n in conn.execute(TRIAL_STATES, {"name": STUDY})})


def wait_for_workers(folder: Path, workers: int, url: str, deadline: float, stop_file: Path) -> bool:
    """True once every worker wrote its submitit result (no RPC: the files, and the storage for progress);
    False at the deadline or once `stop_file` exists (`touch ROW/STOP` ends a row early, measured so far)."""
    last = ""
    while time.monotonic() < deadline and not stop_file.exists():
        results = len(list(folder.glob("*_result.pkl"))) if folder.exists() else 0
        try:
            states: Any = dict(trial_states(url))
        except sa.exc.OperationalError as error:
            states = f"unreadable: {str(error).splitlines()[0][:200]}"
        line = f"workers done {results}/{workers}, trials {states}"
        if line != last:
            print(f"  {time.strftime('%H:%M:%S')} {line}", flush=True)
            last = line
        if results >= workers:
            return True
        time.sleep(5)
    return False


# --- results -----------------------------------------------------------------------------------
def trial_outcomes(url: str, jobs: list[dict[str, str]], trials: int, finished: bool) -> dict[str, Any]:
    """Lost: the budget minus COMPLETE/PRUNED when the workers finished; for a row stopped early (`study
    stop`, which re-enqueues its running trials), the FAIL trials nobody retried and trials left RUNNING."""
    import optuna

    storage = optuna.storages.RDBStorage(url)
    everything = storage.get_all_trials(storage.get_study_id_from_name(STUDY), deepcopy=False)
    counted = [t for t in everything if not t.user_attrs.get("over_budget")]
    states = Counter(t.state.name for t in counted)
    done = states["COMPLETE"] + states["PRUNED"]
    unretried = sum(t.state.name == "FAIL" and not t.user_attrs.get("retried") for t in counted)
    lost = trials - done if finished else unretried + states["RUNNING"]
    duplicated = sorted({*duplicated_folders(counted), *duplicated_jobs(jobs)})
    return {"states": dict(states), "over_budget": len(everything) - len(counted), "lost": lost,
            "budget_not_reached": trials - done - lost, "failed": states["FAIL"], "duplicated": duplicated,
            "fail_reasons": dict(Counter(str(t.user_attrs.get("fail_reason")) for t in counted
                                         if t.state.name == "FAIL"))}


def duplicated_folders(trials: list[Any]) -> list[int]:
    """Trials whose folder holds more than one job result, summary, or a step logged twice."""
    found = []
    for trial in trials:
        run_dir = trial.user_attrs.get("run_dir")
        if not run_dir:
            continue
        records = read_jsonl(Path(run_dir) / "metrics.jsonl")
        steps = [r.get("step") for r in records if r.get("kind") == "log"]
        summaries = sum(r.get("kind") == "summary" for r in records)
        results = len(list((Path(run_dir) / "jobs").glob("*_result.pkl")))
        if results > 1 or summaries > 1 or len(steps) != len(set(steps)):
            found.append(trial.number)
    return found


def duplicated_jobs(jobs: list[dict[str, str]]) -> list[int]:
    """Trial numbers with more than one COMPLETED trial job (job name abtune-N)."""
    completed = Counter(j["name"] for j in jobs if j["state"] == "COMPLETED" and is_trial_job(j))
    return [int(name.rsplit("-", 1)[1]) for name, n in completed.items() if n > 1 and name.rsplit("-", 1)[1].isdigit()]


def is_trial_job(job: dict[str, str]) -> bool:
    return job["name"].startswith("abtune-") and not job["name"].startswith("abtune-study-")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# --- the MLflow page ---------------------------------------------------------------------------
def start_ui(repo: Path, env: dict[str, str], cwd: Path, tracking: str, storage: str) -> tuple[Any, str]:
    """`abtune ui` for both stores; its process and the study experiment's link."""
    process = subprocess.Popen([repo_python(repo), "-m", "abtune.cli", "ui", "--tracking-uri", tracking,
                                "--storage", storage], cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, lines = time.monotonic() + 180, []
    while time.monotonic() < deadline and process.stdout is not None:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line.rstrip())
        if line.startswith("Ctrl-C"):
            links = dict(x.removeprefix("  experiment ").split(": ", 1) for x in lines if x.startswith("  experiment "))
            return process, links[STUDY]
    stop_group(process)
    raise RuntimeError(f"abtune ui did not come up: {lines[-20:]}")


def stop_group(process: Any) -> None:
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def measure_mlflow_page(link: str, folder: Path) -> dict[str, Any]:
    from tests import browser

    start = time.monotonic()
    dom = browser.render(link, folder / "mlflow-experiment.png", folder / "chromium-profile")
    seconds = time.monotonic() - start
    return {"chromium_dump_s": seconds, "grid_rows": len(browser.grid_rows(dom)),
            "page_time_budget_ms": browser.PAGE_TIME_MS, "search_api": search_api_time(link)}


def search_api_time(link: str) -> dict[str, Any]:
    """MLflow's runs search of the experiment (what the page asks for first), 100 runs a page, timed."""
    base, experiment = re.match(r"(http://[^/#]+).*experiments/(\d+)", link).groups()  # type: ignore[union-attr]
    body = json.dumps({"experiment_ids": [experiment], "max_results": 100,
                       "order_by": ["attributes.start_time DESC"]}).encode()
    start, pages, runs, token = time.monotonic(), 0, 0, None
    first = None
    while True:
        payload = json.loads(body) | ({"page_token": token} if token else {})
        request = urllib.request.Request(f"{base}/ajax-api/2.0/mlflow/runs/search", json.dumps(payload).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        pages, runs = pages + 1, runs + len(answer.get("runs", []))
        first = first or time.monotonic() - start
        token = answer.get("next_page_token")
        if not token:
            break
    return {"first_page_s": first, "all_pages_s": time.monotonic() - start, "pages": pages, "runs": runs}


# --- one row -----------------------------------------------------------------------------------
def per(count: float, unit: float) -> float | None:
    return round(count / unit, 3) if unit else None


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    jobs = result["jobs"]
    trial_jobs = sum(is_trial_job(j) for j in jobs)
    worker_min = sum(int(j["elapsed_s"] or 0) for j in jobs if j["name"].startswith("abtune-study-")) / 60
    ctld, dbd, calls = result["counters"]["slurmctld"], result["counters"]["slurmdbd"], result["calls"]
    return {"trial_jobs": trial_jobs, "worker_minutes": round(worker_min, 2),
            "ctld_rpcs_per_trial_job": {k: per(v, trial_jobs) for k, v in sorted(ctld.items(), key=lambda kv: -kv[1])},
            "ctld_rpcs_total_per_trial_job": per(sum(ctld.values()), trial_jobs),
            "dbd_rpcs_per_trial_job": {k: per(v, trial_jobs) for k, v in sorted(dbd.items(), key=lambda kv: -kv[1])},
            "dbd_rpcs_total_per_trial_job": per(sum(dbd.values()), trial_jobs),
            "calls_per_trial_job": {k: per(v, trial_jobs) for k, v in calls.items()},
            "cpu_s_per_trial_job": {"trial_job": per(result["job_cpu"]["trial_cpu_s"], trial_jobs),
                                    "worker": per(result["job_cpu"]["worker_cpu_s"] + result["live_worker_cpu_s"],
                                                  trial_jobs),
                                    **{name: per(after - result["daemon_cpu_before"].get(name, 0), trial_jobs)
                                       for name, after in result["daemon_cpu_after"].items()}},
            "calls_per_worker_minute": {k: per(v, worker_min) for k, v in calls.items()},
            "database_per_trial_job": database_per_trial_job(result["database_before"], result["database_after"],
                                                             trial_jobs)}


def table_row(args: argparse.Namespace, result: dict[str, Any]) -> str:
    s, p, o, e, m = (result["summary"], result["probe"], result["outcomes"], result["end_commands"],
                     result.get("mlflow", {}))
    top = ", ".join(f"{k.removeprefix('REQUEST_')} {v}" for k, v in list(s["ctld_rpcs_per_trial_job"].items())[:3])
    cpm = s["calls_per_worker_minute"]
    return (f"| {args.workers} | {args.trials} | {s['trial_jobs']} | {result['study_minutes']:.1f} | "
            f"{s['ctld_rpcs_total_per_trial_job']} ({top}) | {s['dbd_rpcs_total_per_trial_job']} | "
            f"{cpm.get('squeue', 0)} / {cpm.get('sacct', 0)} | "
            f"{fmt(p['ask_ms'])} | {fmt(p['tell_ms'])} | "
            f"{e.get('status', 0):.1f} / {e.get('best', 0):.1f} / {e.get('export', 0):.1f} | "
            f"{m.get('chromium_dump_s', float('nan')):.1f} ({m.get('grid_rows', '-')} rows) | "
            f"{o['lost']} | {o['failed']} | {len(o['duplicated'])} | {o['states']} |")


def fmt(q: dict[str, Any]) -> str:
    return "-" if q["p50"] is None else f"{q['p50']:.1f} / {q['p99']:.1f}"


HEADER = ("| workers | trials | trial jobs | study min | ctld RPCs / trial job (top 3) | dbd RPCs / trial job | "
          "squeue / sacct per worker-min | ask ms p50/p99 | tell ms p50/p99 | status / best / export s | "
          "MLflow page s | lost | failed | duplicated | trial states |\n|" + "---|" * 15)


def run_row(args: argparse.Namespace, row: Path, parts: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "uptime_before": uptime(),
                              "python": repo_python(args.repo), "repo": str(args.repo),
                              "repo_commit": git_describe(args.repo)}
    state, shims_log = row / "slurm", row / "calls.log"
    print(f"cluster: {args.nodes} nodes, port base {args.port_base}, state {state}", flush=True)
    parts["cluster"] = state
    cluster("up", args, state)
    parts["postgres"] = row / "pg"
    pg = postgres_up(row / "pg", args.pg_max_connections)
    storage_url = pg.url()
    create_database(storage_url, "mlflow")
    tracking = pg.url("mlflow")  # postgresql+psycopg2: MLflow would pick psycopg 3, not installed, for postgresql://
    shims = write_shims(row / "shims", shims_log)
    env = abtune_env(args.repo, state, shims)
    work = row / "work"
    work.mkdir()
    abtune(args.repo, env, work, "study", "create", str(study_file(row, args.repo, args.trials, args.steps)),
           "--storage", storage_url)
    timed_python = write_timed_python(row / "python-timed", repo_python(args.repo), row / "cpu.log")
    profile = profile_file(row, args.workers, shims, timed_python)

    stop = multiprocessing.Event()
    parts["probe"] = multiprocessing.Process(target=probe, args=(storage_url, args.probe_every, row / "probe.jsonl", stop),
                                             daemon=True)
    parts["probe_stop"] = stop
    slurm_env = cluster_env(args, state)
    dbd_before = reset_counters(slurm_env)
    result["daemon_cpu_before"] = daemon_cpu(row)
    result["database_before"] = database_stats(storage_url)
    sacct_start = time.strftime("%Y-%m-%dT%H:%M:%S")
    parts["probe"].start()
    started = time.monotonic()
    _, out = abtune(args.repo, env, work, "study", "launch", STUDY, "--workers", str(args.workers), "--launcher",
                    str(profile), "--storage", storage_url, "--tracking-uri", tracking)
    print("  " + out.strip(), flush=True)
    finished = wait_for_workers(work / "runs" / "studies" / STUDY / "workers", args.workers, storage_url,
                                started + 60 * args.timeout_min, row / "STOP")
    result["study_minutes"] = (time.monotonic() - started) / 60
    result["workers_finished"] = finished
    stop.set()
    parts["probe"].join(timeout=60)
    calls_lines = len(shims_log.read_text().splitlines()) if shims_log.exists() else 0
    result["daemon_cpu_after"] = daemon_cpu(row)
    time.sleep(PG_STATS_FLUSH_S)
    result["database_after"] = database_stats(storage_url)
    result["live_worker_cpu_s"] = live_worker_cpu(work / "runs" / "studies" / STUDY / "workers")
    result["counters"] = read_counters(slurm_env, dbd_before)
    result["calls"] = dict(shim_counts(shims_log, calls_lines))
    result["jobs"] = jobs_since(slurm_env, sacct_start)
    if not finished:  # the rates above are measured; stop the rest as a user would
        result["study_stop"] = abtune(args.repo, env, work, "study", "stop", STUDY, "--storage", storage_url,
                                      "--tracking-uri", tracking)
    result["job_cpu"] = job_cpu(row / "cpu.log")
    result["summary"] = summarize(result)
    result["probe"] = probe_summary(row / "probe.jsonl")
    result["outcomes"] = trial_outcomes(storage_url, result["jobs"], args.trials, finished)
    result["end_commands"] = end_commands(args.repo, env, work, storage_url, row)
    result["calls_by_end_commands"] = dict(shim_counts(shims_log) - shim_counts(shims_log, calls_lines))
    result["mlflow"] = mlflow_page(args, env, work, tracking, storage_url, row, parts)
    result["uptime_after"] = uptime()
    return result


def end_commands(repo: Path, env: dict[str, str], work: Path, url: str, row: Path) -> dict[str, float]:
    times = {}
    for name, extra in (("status", ()), ("best", ()), ("export", ("--format", "json", "--output", str(row / "export.json")))):
        times[name], out = abtune(repo, env, work, "study", name, STUDY, "--storage", url, *extra)
        (row / f"study-{name}.txt").write_text(out)
    return times


def mlflow_page(args: argparse.Namespace, env: dict[str, str], work: Path, tracking: str, storage: str,
                row: Path, parts: dict[str, Any]) -> dict[str, Any]:
    try:
        parts["ui"], link = start_ui(args.repo, env, work, tracking, storage)
        return {"link": link, **measure_mlflow_page(link, row)}
    except Exception as error:  # the rest of the row is still worth having
        return {"error": str(error)[-1000:]}
    finally:
        stop_group(parts.pop("ui", None))


def git_describe(repo: Path) -> str:
    """`git describe --dirty` plus a hash of the uncommitted diff; for an exported tree, its COMMIT file."""
    if not (repo / ".git").exists():
        commit = repo / "COMMIT"
        return f"export of {commit.read_text().strip()}" if commit.exists() else "?"
    git = ["git", "-C", str(repo)]
    described = subprocess.run([*git, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout
    diff = subprocess.run([*git, "diff", "HEAD"], capture_output=True).stdout
    return f"{described.strip()} (diff sha1 {hashlib.sha1(diff).hexdigest()[:12]})" if diff else described.strip()


def tear_down(args: argparse.Namespace, parts: dict[str, Any]) -> None:
    stop_group(parts.pop("ui", None))
    if "probe" in parts:
        parts["probe_stop"].set()
        parts["probe"].join(timeout=30)
        if parts["probe"].is_alive():
            parts["probe"].kill()
    steps = [("cluster", lambda: cluster("down", args, parts["cluster"])),
             ("postgres", lambda: postgres.down(parts["postgres"]))]
    for name, step in steps:
        if name in parts:
            try:
                step()
            except Exception as error:  # go on: the next part must come down too
                print(f"tear-down of {name} failed: {error}", file=sys.stderr)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, required=True, help="`study launch --workers`")
    parser.add_argument("--trials", type=int, required=True, help="the study's budget")
    parser.add_argument("--steps", type=int, default=4, help="training steps per trial")
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout whose abtune runs (its .venv, PYTHONPATH)")
    parser.add_argument("--nodes", type=int, default=16, help="virtual SLURM nodes")
    parser.add_argument("--port-base", type=int, default=7817, help="ABTUNE_SLURM_PORT_BASE of this cluster")
    parser.add_argument("--out", type=Path, default=Path("/tmp/scale"), help="rows go to OUT/wW-tT-STAMP")
    parser.add_argument("--pg-max-connections", type=int, default=400, help="PostgreSQL max_connections")
    parser.add_argument("--probe-every", type=float, default=3.0, help="seconds between storage probes")
    parser.add_argument("--timeout-min", type=float, default=60.0, help="give up waiting for the workers after this")
    args = parser.parse_args()
    args.repo = args.repo.resolve()
    return args


def main() -> int:
    args = parse_args()
    row = args.out / f"w{args.workers}-t{args.trials}-{time.strftime('%Y%m%dT%H%M%S')}"
    row.mkdir(parents=True)
    for folder in (args.out, row):
        folder.chmod(0o755)  # the slurm, munge, mysql and postgres users traverse it
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (`&`: ignored)
    parts: dict[str, Any] = {}
    try:
        result = run_row(args, row, parts)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second signal must not leave daemons behind
            signal.signal(signum, signal.SIG_IGN)
        tear_down(args, parts)
    result["uptime_after_teardown"] = uptime()
    (row / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"uptime before: {result['uptime_before']}\nuptime after:  {result['uptime_after']}")
    print(f"result: {row / 'result.json'}\n{HEADER}\n{table_row(args, result)}")
    print(f"per trial job, as PostgreSQL counts it: {json.dumps(result['summary']['database_per_trial_job'])}")
    return 0 if result["workers_finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
