"""Ask/tell latency of Optuna's storages with 1, 4 and 8 concurrent workers, side by side in one run.

    python benchmarks/bench_storage.py [--trials 40] [--workers 1,4,8] [--backends sqlite,journal,postgres]
                                       [--postgres-url URL]

Each worker is a spawned process doing `--trials` ask + suggest_float + tell pairs (RandomSampler,
so the time is the storage's) on one study per (backend, workers) cell, all workers released at
once. Per cell: median and p95 milliseconds per pair over every pair of every worker, and trials/s
(all trials over the wall time from the common start to the last worker's end). Fresh storage per
cell: a new SQLite file, a new journal file (both in one temporary directory on local disk), a new
PostgreSQL database. Without --postgres-url a throw-away server is started with tests/postgres/pg.sh
(needs PostgreSQL installed, or root to install it) and stopped at the end.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres, also in spawned workers

import optuna  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from abtune.redact import redact  # noqa: E402
from tests.postgres import server, workers  # noqa: E402


def fresh_postgres_db(url: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)


def measure(spec: workers.StorageSpec, n_workers: int, n_trials: int) -> dict:
    optuna.create_study(study_name="bench", storage=workers.make_storage(spec))
    results, wall = workers.run_workers(workers.ask_tell, spec, "bench", n_workers, n_trials)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"{spec[0]} with {n_workers} workers failed: {errors[0]}")
    trials = optuna.load_study(study_name="bench", storage=workers.make_storage(spec)).get_trials()
    assert len(trials) == n_workers * n_trials and all(t.state.name == "COMPLETE" for t in trials)
    ms = sorted(1000 * x for r in results for x in r["latencies"])
    return {"median": statistics.median(ms), "p95": statistics.quantiles(ms, n=20)[18],
            "per_s": len(ms) / wall}


def machine(postgres_url: str | None) -> str:
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    pg = "-"
    if postgres_url:
        with sa.create_engine(postgres_url, poolclass=sa.pool.NullPool).connect() as conn:
            pg = conn.execute(sa.text("SHOW server_version")).scalar()
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return (f"{platform.system()} {platform.machine()}, nproc {nproc}, {model}, Python {platform.python_version()}, "
            f"Optuna {optuna.__version__}, SQLAlchemy {sa.__version__}, SQLite {sqlite3.sqlite_version}, "
            f"PostgreSQL {pg}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40, help="ask/tell pairs per worker")
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument("--backends", default="sqlite,journal,postgres")
    parser.add_argument("--postgres-url", help="an existing server (default: start one with tests/postgres/pg.sh)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="abtune-bench-storage-", dir="/tmp"))
    tmp.chmod(0o755)  # the postgres user must traverse it
    pg_url, pg_state = args.postgres_url, None
    try:
        if "postgres" in backends and not pg_url:
            pg_state = tmp / "pg"
            pg_url = server.up(pg_state).url()
        print(machine(pg_url if "postgres" in backends else None))
        if pg_url:
            print(f"PostgreSQL: {redact(pg_url)}")
        print(f"{args.trials} ask+tell pairs per worker\n")
        print("| workers | storage | median ms/pair | p95 ms/pair | trials/s |")
        print("|---|---|---|---|---|")
        for n_workers in (int(w) for w in args.workers.split(",")):
            for backend in backends:
                cell = tmp / f"{backend}-{n_workers}"
                if backend == "postgres":
                    spec = ("rdb", fresh_postgres_db(pg_url))
                elif backend == "journal":
                    spec = ("journal", f"{cell}.journal")
                else:
                    spec = ("rdb", f"sqlite:///{cell}.db")
                m = measure(spec, n_workers, args.trials)
                print(f"| {n_workers} | {backend} | {m['median']:.1f} | {m['p95']:.1f} | {m['per_s']:.1f} |", flush=True)
    finally:
        if pg_state:
            server.down(pg_state)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
