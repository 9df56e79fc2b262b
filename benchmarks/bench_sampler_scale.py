"""How a study's ask time grows with its finished trials, sampler alone (issue 25).

    python benchmarks/bench_sampler_scale.py [--finished 100 1000 10000] [--asks 20] [--repeats 3]

For each number of finished trials N and each objective set (top1 alone, as the scale harness's study;
top1 and inter-node bytes, as the quickstart), an in-memory study is filled with N COMPLETE trials of
the quickstart's search space (random parameters, random values), then timed: `ask()` plus the space's
suggestions with the sampler `abtune study` builds (`definition.build_sampler`: TPE, constant liar,
10 startup trials), each asked trial told FAIL so the next ask sees the same N. In memory, so this is
the sampler's time; what a storage adds (reads, through Optuna's cache) is the scale harness's probe.
Arms interleaved (every N and objective set in one round, `--repeats` rounds); per arm the median over
rounds of the median ask, and the spread of the round medians. Prints a table; `uptime` before and after.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import time
from typing import Any

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from abtune.study.definition import build_sampler
from abtune.study.spec import parse_study_spec

SPACE = {  # the quickstart study's (studies/quickstart.yaml)
    "method.warmup_frac": FloatDistribution(0.1, 0.3),
    "method.ab_frac": FloatDistribution(0.015, 0.07, log=True),
    "method.rebound_frac": FloatDistribution(0.1, 0.5),
    "method.lr_rebound_frac": FloatDistribution(0.25, 1.0),
    "method.sigma_cutoff": FloatDistribution(0.04, 0.3, log=True),
}
OBJECTIVE_SETS = {"top1": ["top1"], "top1+bytes": ["top1", "inter_node_bytes"]}


def study_spec(objectives: list[str]) -> Any:
    space = {name: {"low": d.low, "high": d.high, "log": d.log} for name, d in SPACE.items()}
    return parse_study_spec({"name": "sampler-scale", "base": {"model": {"arch": "vit"}, "train": {"steps": 300}},
                             "space": space, "objectives": objectives, "layout": {"nproc": 4, "ranks_per_node": 2},
                             "sampler": {"name": "tpe", "seed": 0, "options": {"n_startup_trials": 10}},
                             "references": {"paper_defaults": False, "ddp": False}, "trials": 10}, "benchmark")


def filled_study(objectives: list[str], finished: int, rng: random.Random) -> tuple[optuna.Study, Any]:
    spec = study_spec(objectives)
    directions = ["maximize" if name == "top1" else "minimize" for name in objectives]
    study = optuna.create_study(directions=directions, sampler=build_sampler(spec))
    study.add_trials([
        create_trial(state=TrialState.COMPLETE, distributions=SPACE,
                     params={name: rng.uniform(d.low, d.high) for name, d in SPACE.items()},
                     values=[rng.random() if name == "top1" else rng.uniform(1e6, 1e8) for name in objectives])
        for _ in range(finished)])
    return study, spec


def median_ask_ms(study: optuna.Study, asks: int) -> float:
    times = []
    for _ in range(asks):
        start = time.perf_counter()
        trial = study.ask()
        for name, distribution in SPACE.items():
            trial._suggest(name, distribution)
        times.append((time.perf_counter() - start) * 1000)
        study.tell(trial, state=TrialState.FAIL)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--asks", type=int, default=20, help="asks timed per arm and round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, arms interleaved")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    studies = {(label, n): filled_study(objectives, n, random.Random(n))[0]
               for label, objectives in OBJECTIVE_SETS.items() for n in args.finished}
    rounds: dict[tuple[str, int], list[float]] = {arm: [] for arm in studies}
    for _ in range(args.repeats):
        for arm, study in studies.items():
            rounds[arm].append(median_ask_ms(study, args.asks))
    print("uptime after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"\n| objectives | finished trials | ask + {len(SPACE)} suggests, ms (median of {args.repeats} round medians) "
          "| round medians, min-max |")
    print("|---|---|---|---|")
    for (label, n), values in rounds.items():
        print(f"| {label} | {n} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |")


if __name__ == "__main__":
    main()
