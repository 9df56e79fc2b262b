"""Orchestration overhead per study trial, cold and warm rank start-up side by side (SQLite).

    python benchmarks/bench_study_overhead.py [--config studies/run_quickstart.yaml] [--steps 100] [--trials 4]
                                              [--quickstart] [--modes cold,warm]

For each mode (cold: ABTUNE_WARM_START=0, every rank imports torch and abtune; warm: ranks fork from
the command's warm server, abtune/launch/warm.py), runs a study of `--trials` trials one at a time (no
reference trials, random sampler) on the given run config, then one plain `abtune train` of the same
config. For each trial: wall time (ask to tell, measured by the runner), training time (the summary's
train_seconds: optimizer steps only) and their difference, the overhead. The plain run gives what
every run pays outside training (starting the ranks, process group, data, model, final evaluation,
summary); the study adds the submitit job, run folder, storage round trips, pruning hook and polling.

`--quickstart` also times the quickstart study end to end (`abtune study create studies/quickstart.yaml`
and `abtune study run quickstart`: 8 trials of 300 steps, 2 of them reference trials) in each mode.
The modes alternate within one invocation; the load average is printed before and after each part,
as the machine may be shared.
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
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml

QUICKSTART = Path("studies/quickstart.yaml")


@dataclass
class Measured:
    mode: str
    trials: list[tuple[float, float]] = field(default_factory=list)  # (wall, train) per trial
    plain: tuple[float, float] = (0.0, 0.0)
    quickstart_seconds: float | None = None
    quickstart_trials: list[tuple[float, float]] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def abtune(mode: str, *args: str, cwd: Path) -> None:
    env = {**os.environ, "ABTUNE_WARM_START": "0" if mode == "cold" else "1"}
    env.pop("ABTUNE_WARM_SOCKET", None)  # each command owns its server, as a user's would
    subprocess.run([sys.executable, "-m", "abtune.cli", *args], check=True, capture_output=True, cwd=cwd, env=env)


def write_study(folder: Path, config: Path, steps: int, trials: int, nproc: int, per_node: int) -> Path:
    study = {"name": "overhead", "base": str(config.resolve()), "overrides": {"train.steps": steps},
             "layout": {"nproc": nproc, "ranks_per_node": per_node},
             "sampler": {"name": "random", "seed": 0}, "references": {"paper_defaults": False, "ddp": False},
             "trials": trials}
    path = folder / "overhead.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def stored_trials(folder: Path, name: str) -> list[tuple[float, float]]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder}/optuna.db")
    trials = storage.get_all_trials(storage.get_study_id_from_name(name))
    return [(t.user_attrs["wall_seconds"], t.user_attrs["train_seconds"]) for t in trials]


def overhead_study(mode: str, args: argparse.Namespace, measured: Measured) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        study = write_study(folder, args.config, args.steps, args.trials, args.nproc, args.ranks_per_node)
        abtune(mode, "study", "create", str(study), cwd=folder)
        abtune(mode, "study", "run", "overhead", cwd=folder)
        measured.trials = stored_trials(folder, "overhead")
        config = folder / "runs/studies/overhead/trials/0/config.yaml"
        started = time.perf_counter()
        abtune(mode, "train", str(config), "--nproc", str(args.nproc), "--ranks-per-node", str(args.ranks_per_node),
               "--run-dir", str(folder / "plain"), "--no-tracking", cwd=folder)
        wall = time.perf_counter() - started
        measured.plain = wall, json.loads((folder / "plain/summary.json").read_text())["timing"]["train_seconds"]


def quickstart(mode: str, measured: Measured) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        started = time.perf_counter()
        abtune(mode, "study", "create", str(QUICKSTART.resolve()), cwd=folder)
        abtune(mode, "study", "run", "quickstart", cwd=folder)
        measured.quickstart_seconds = time.perf_counter() - started
        measured.quickstart_trials = stored_trials(folder, "quickstart")


def report(args: argparse.Namespace, results: list[Measured]) -> None:
    print(f"\n{args.trials} trials of {args.config} at {args.steps} steps, {args.nproc} ranks / "
          f"{args.nproc // args.ranks_per_node} nodes, one at a time; overhead = wall - train (seconds)")
    header = " | ".join(f"{m.mode} wall | {m.mode} train | {m.mode} overhead" for m in results)
    print(f"| trial | {header} |")
    print("|---|" + "---|" * 3 * len(results))
    for number in range(args.trials):
        cells = " | ".join(f"{m.trials[number][0]:.1f} | {m.trials[number][1]:.1f} | "
                           f"{m.trials[number][0] - m.trials[number][1]:.1f}" for m in results)
        print(f"| {number} | {cells} |")
    for m in results:
        median = statistics.median(wall - train for wall, train in m.trials)
        wall, train = m.plain
        print(f"{m.mode}: median overhead per trial {median:.1f} s; plain `abtune train`: {wall:.1f} s wall, "
              f"{train:.1f} s training, {wall - train:.1f} s outside training; load averages {', '.join(m.loads)}")
    timed = [m for m in results if m.quickstart_seconds is not None]
    if timed:
        print("\nquickstart study (8 trials of 300 steps, one at a time):")
        for m in timed:
            median = statistics.median(wall - train for wall, train in m.quickstart_trials)
            train = sum(train for _, train in m.quickstart_trials)
            print(f"{m.mode}: {m.quickstart_seconds:.0f} s end to end, {train:.0f} s of it training; "
                  f"median trial overhead {median:.1f} s")
        if len(timed) == 2:
            print(f"speed-up: {timed[0].quickstart_seconds / timed[1].quickstart_seconds:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--modes", default="cold,warm", help="comma-separated: cold, warm")
    parser.add_argument("--quickstart", action="store_true", help="also time the quickstart study end to end")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"load average (1/5/15 min) at start {load()}", flush=True)
    results = [Measured(mode) for mode in args.modes.split(",")]
    for m in results:
        m.loads.append(load())
        overhead_study(m.mode, args, m)
        m.loads.append(load())
        print(f"{m.mode}: overhead study done, load {load()}", flush=True)
    for m in results if args.quickstart else []:
        m.loads.append(load())
        quickstart(m.mode, m)
        m.loads.append(load())
        print(f"{m.mode}: quickstart done in {m.quickstart_seconds:.0f} s, load {load()}", flush=True)
    report(args, results)


if __name__ == "__main__":
    main()
