"""Orchestration overhead per study trial: a trial's wall time minus its training time (SQLite).

    python benchmarks/bench_study_overhead.py [--config studies/run_quickstart.yaml] [--steps 100] [--trials 4]

Runs a study of `--trials` trials one at a time (no reference trials, random sampler) on the given
run config, then one plain `abtune train` of the same config. For each trial: wall time (ask to
tell, measured by the runner), training time (the summary's train_seconds: optimizer steps only)
and their difference. The plain run splits that difference into what every run pays (starting
the ranks: interpreter, torch import, process group, data, model, final evaluation, summary) and
what the study adds (submitit job, run folder, storage round trips, pruning hook, polling); the
last column is the runner's own share before the job starts (ask, suggest, config, run folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml


def abtune(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "abtune.cli", *args], check=True, capture_output=True, cwd=cwd)


def write_study(folder: Path, config: Path, steps: int, trials: int, nproc: int, per_node: int) -> Path:
    study = {"name": "overhead", "base": str(config.resolve()), "overrides": {"train.steps": steps},
             "layout": {"nproc": nproc, "ranks_per_node": per_node},
             "sampler": {"name": "random", "seed": 0}, "references": {"paper_defaults": False, "ddp": False},
             "trials": trials}
    path = folder / "overhead.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def plain_run(folder: Path, nproc: int, per_node: int) -> tuple[float, float]:
    """(wall, train) seconds of `abtune train` on the first trial's config."""
    config = folder / "runs/studies/overhead/trials/0/config.yaml"
    started = time.perf_counter()
    abtune("train", str(config), "--nproc", str(nproc), "--ranks-per-node", str(per_node),
           "--run-dir", str(folder / "plain"), cwd=folder)
    wall = time.perf_counter() - started
    return wall, json.loads((folder / "plain/summary.json").read_text())["timing"]["train_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load average at start {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        study = write_study(folder, args.config, args.steps, args.trials, args.nproc, args.ranks_per_node)
        abtune("study", "create", str(study), cwd=folder)
        abtune("study", "run", "overhead", cwd=folder)
        storage = optuna.storages.RDBStorage(f"sqlite:///{folder}/optuna.db")
        trials = storage.get_all_trials(storage.get_study_id_from_name("overhead"))
        plain_wall, plain_train = plain_run(folder, args.nproc, args.ranks_per_node)
    print(f"{args.trials} trials of {args.config} at {args.steps} steps, {args.nproc} ranks / "
          f"{args.nproc // args.ranks_per_node} nodes, one at a time; load average at end {os.getloadavg()[0]:.1f}")
    print("| trial | wall s | train s | overhead s | of which ask to submit s |")
    print("|---|---|---|---|---|")
    overheads = []
    for trial in trials:
        wall, train = trial.user_attrs["wall_seconds"], trial.user_attrs["train_seconds"]
        overheads.append(wall - train)
        prepare = trial.user_attrs["prepare_seconds"]
        print(f"| {trial.number} | {wall:.1f} | {train:.1f} | {wall - train:.1f} | {prepare:.2f} |")
    median = statistics.median(overheads)
    plain = plain_wall - plain_train
    print(f"median overhead per trial: {median:.1f} s; a plain `abtune train` of the same config: "
          f"{plain_wall:.1f} s wall, {plain_train:.1f} s training, {plain:.1f} s outside training")
    print(f"added by the study (median trial overhead minus the plain run's): {median - plain:.1f} s")


if __name__ == "__main__":
    main()
