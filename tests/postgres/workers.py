"""Several real processes sharing one Optuna storage (used by test_storage.py and benchmarks/bench_storage.py).

A storage is described by a picklable `(kind, target)` pair, built afresh in each process:
("rdb", URL) for SQLite or PostgreSQL, ("journal", PATH) for a journal file.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import optuna

from abtune.redact import redact

START_TIMEOUT_S = 120  # for every spawned interpreter to import optuna, on a busy machine
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout; without one an unanswering server hangs a worker forever
StorageSpec = tuple[str, str]


def make_storage(spec: StorageSpec, sqlite_timeout_s: float | None = None) -> optuna.storages.BaseStorage:
    kind, target = spec
    if kind == "journal":
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(target))
    if kind != "rdb":
        raise ValueError(f"unknown storage kind {kind!r}")
    connect_args: dict[str, Any] = {}
    if target.startswith("postgresql"):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    elif target.startswith("sqlite") and sqlite_timeout_s is not None:
        connect_args["timeout"] = sqlite_timeout_s  # sqlite3's busy timeout (default 5 s)
    return optuna.storages.RDBStorage(target, engine_kwargs={"connect_args": connect_args})


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -10.0, 10.0)
    return x * x


def optimize(spec: StorageSpec, study_name: str, worker: int, n_trials: int, sqlite_timeout_s: float | None) -> dict:
    """One worker: `study.optimize` for n_trials cheap trials, each tagged with the worker's number."""
    study = optuna.load_study(study_name=study_name, storage=make_storage(spec, sqlite_timeout_s),
                              sampler=optuna.samplers.RandomSampler(seed=worker))

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", worker)
        return _objective(trial)

    study.optimize(objective, n_trials=n_trials)
    return {"worker": worker}


def ask_tell(spec: StorageSpec, study_name: str, worker: int, n_trials: int, sqlite_timeout_s: float | None) -> dict:
    """One benchmark worker: n_trials ask+tell pairs; returns the latency of each pair in seconds."""
    study = optuna.load_study(study_name=study_name, storage=make_storage(spec, sqlite_timeout_s),
                              sampler=optuna.samplers.RandomSampler(seed=worker))
    latencies = []
    for _ in range(n_trials):
        t0 = time.perf_counter()
        trial = study.ask()
        study.tell(trial, _objective(trial))
        latencies.append(time.perf_counter() - t0)
    return {"worker": worker, "latencies": latencies}


def _entry(fn: Callable[..., dict], args: tuple, ready: Any, go: Any, results: Any) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        ready.put(args[2])
        if not go.wait(timeout=START_TIMEOUT_S):  # all workers start together, so they really contend
            raise TimeoutError("no start signal")
        out = fn(*args)
        out["end"] = time.perf_counter()
        results.put(out)
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        results.put({"worker": args[2], "error": redact(f"{type(exc).__name__}: {first}"),
                     "traceback": redact(traceback.format_exc())})


def _get(q: Any, procs: list, timeout_s: float) -> Any:
    """q.get(), but give up early if a worker died without putting anything (e.g. failed to import)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker process exited with code {dead[0]}") from None
    raise RuntimeError(f"no answer from the workers within {timeout_s}s")


def run_workers(fn: Callable[..., dict], spec: StorageSpec, study_name: str, workers: int, n_trials: int,
                sqlite_timeout_s: float | None = None, timeout_s: float = 300) -> tuple[list[dict], float]:
    """Start `workers` spawned processes running fn(spec, study_name, i, n_trials, sqlite_timeout_s) at
    once. Returns one result dict per worker (with "error" if it raised), sorted by worker, and the
    wall time from the common start to the last worker's end."""
    ctx = mp.get_context("spawn")  # fresh interpreters: no engine or file handle inherited via fork
    ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, (spec, study_name, i, n_trials, sqlite_timeout_s), ready, go, results))
             for i in range(workers)]
    for p in procs:
        p.start()
    out = []
    try:
        for _ in procs:
            _get(ready, procs, START_TIMEOUT_S)
        go.set()
        start = time.perf_counter()
        for _ in procs:
            out.append(_get(results, procs, timeout_s))
    except RuntimeError as exc:
        start = time.perf_counter()
        out.append({"worker": -1, "error": str(exc)})
        for p in procs:  # the others would wait for a start signal or a lock that never comes
            p.kill()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    wall = max((r["end"] for r in out if "end" in r), default=start) - start
    return sorted(out, key=lambda r: r["worker"]), wall
