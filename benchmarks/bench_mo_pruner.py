"""What `pruner: pareto-asha` buys a multi-objective study: hypervolume of the front against trial-seconds.

    python benchmarks/bench_mo_pruner.py [--out runs/bench-mo-pruner] [--seeds 20] [--budget-trials 40]
                                         [--live-trials 16] [--steps 300]

One invocation, three parts:

1. **Table** (skipped when OUT/table.json exists): every configuration of a grid over the quickstart's
   search space (warmup_frac x ab_frac x rebound_frac x sigma_cutoff, 3 values each: 81; lr_rebound_frac
   at the paper's 0.5) trained once, as a real `abtune study run` of the quickstart run config (4 ranks
   as 2 nodes, 300 steps, an evaluation every 25 steps), plus the DDP reference. Per configuration: the
   final top-1 and inter-node bytes, the trial's wall seconds (the runner's: start-up included), and
   at each evaluation the top-1, the predicted final bytes and the seconds since the trainer began.
2. **Replay** (as tabular HPO benchmarks do): Optuna studies over the same grid (categorical
   parameters) whose trials look their results up in the table instead of training, for `--seeds`
   sampler seeds per arm: TPE without pruning, TPE with pareto-asha, random with pareto-asha, random
   without. The pruner is abtune's own class, fed each evaluation the way the trial hook feeds it. A
   trial pruned at an evaluation costs its wall seconds less the trainer seconds after that
   evaluation. Each study starts with the paper-defaults configuration (never pruned) and runs until
   `--budget-trials` times the mean full trial's seconds are spent. Hypervolume of the completed
   trials' front, in (top-1, inter-node MB), reference point: the worst top-1 of the table and DDP's
   inter-node MB.
3. **Live**: one real study per arm of the first three (sampler seed 0, `--live-trials` trials each, one
   after another), to check the replay against what a study measures: the same values for the same
   configuration, and its trial-seconds.

Writes OUT/results.json, OUT/hypervolume.png and a markdown table on stdout; the load average before
and after each part.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from abtune.attrs import EVALUATIONS_ATTR
from abtune.methods.ab.settings import AbConfig, ABSchedule
from abtune.study.pareto_pruner import ParetoAshaPruner

# The quickstart's ranges, 3 values each, the paper's guideline (AbConfig.guideline) in the middle.
GRID = {"method.warmup_frac": [0.1, 0.2, 0.3], "method.ab_frac": [0.015, 1 / 30, 0.07],
        "method.rebound_frac": [0.1, 0.25, 0.5], "method.sigma_cutoff": [0.04, 0.1, 0.3]}
PAPER = {k: v[1] for k, v in GRID.items()}
OBJECTIVES = ["top1", "inter_node_bytes"]
EVAL_EVERY = 25
ARMS = {  # name: (sampler, pruned)
    "tpe": ("tpe", False),
    "tpe + pareto-asha": ("tpe", True),
    "random + pareto-asha": ("random", True),
    "random": ("random", False),
}
LIVE_ARMS = ("tpe", "tpe + pareto-asha", "random + pareto-asha")
VARIANTS = {  # pareto-asha's settings, replayed with TPE: name -> (options, exact_only)
    "defaults (rungs 1/9, 1/3; keep 1/3; min 3)": ({}, True),
    "first version: bytes before AB's first sync as an upper bound": ({}, False),
    "first_rung 1/3 (one rung)": ({"first_rung": 1 / 3}, True),
    "reduction_factor 2 (rungs 1/9..1/2, keep 1/2)": ({"reduction_factor": 2}, True),
    "min_trials 6": ({"min_trials": 6}, True),
}
MEGA = 1e6


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def key(params: dict[str, Any]) -> str:
    return json.dumps({k: params[k] for k in GRID}, sort_keys=True)


# --- 1. the table ------------------------------------------------------------------------------
def study_file(folder: Path, name: str, steps: int, trials: int, sampler: str, seed: int, pruned: bool,
               ddp: bool) -> Path:
    study = {
        "name": name, "base": str(Path("studies/run_quickstart.yaml").resolve()),
        "overrides": {"train.steps": steps, "train.eval_every": EVAL_EVERY},
        "layout": {"nproc": 4, "ranks_per_node": 2},
        "space": {k: {"choices": v} for k, v in GRID.items()},
        "objectives": OBJECTIVES,
        "sampler": {"name": sampler, "seed": seed, **({"options": {"n_startup_trials": 3}} if sampler == "tpe" else {})},
        "pruner": {"name": "pareto-asha" if pruned else "none"},
        "references": {"paper_defaults": not ddp, "ddp": ddp},
        "trials": trials,
        "study_dir": str(folder / name),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def abtune(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "abtune.cli", *args], check=True)


def record_table(out: Path, steps: int) -> dict[str, Any]:
    url = f"sqlite:///{out}/table.db"
    grid = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    if (out / "table.db").exists():  # an interrupted recording: finish it (the study re-attaches)
        abtune("study", "run", "table", "--storage", url, "--no-tracking")
        return save_table(out, url, time.time(), load(), steps)
    abtune("study", "create", str(study_file(out, "table", steps, len(grid) + 1, "random", 0, False, True)),
           "--storage", url)
    study = optuna.load_study(study_name="table", storage=url)
    for params in grid:
        study.enqueue_trial(params)
    started, before = time.time(), load()
    abtune("study", "run", "table", "--storage", url, "--no-tracking")
    return save_table(out, url, started, before, steps)


def save_table(out: Path, url: str, started: float, load_before: str, steps: int) -> dict[str, Any]:
    table = table_from_study(url, "table")
    table.update(recorded={"seconds": time.time() - started, "load_before": load_before, "load_after": load(),
                           "machine": f"{platform.node()}, {os.cpu_count()} cores", "steps": steps,
                           "date": time.strftime("%Y-%m-%d %H:%M")})
    (out / "table.json").write_text(json.dumps(table, indent=1))
    return table


def table_from_study(url: str, name: str) -> dict[str, Any]:
    rows, ddp = {}, None
    for trial in optuna.load_study(study_name=name, storage=url).get_trials():
        if trial.state != TrialState.COMPLETE:
            continue
        records = [json.loads(line) for line in (Path(trial.user_attrs["run_dir"]) / "metrics.jsonl").open()]
        evaluations = [r for r in records if r.get("kind") == "evaluation"]
        row = {"top1": trial.values[0], "bytes": trial.values[1], "wall_seconds": trial.user_attrs["wall_seconds"],
               "evaluations": [{"step": e["step"], "top1": e["val_top1"],
                                "bytes": e["predicted_training_inter_node_bytes"],
                                "elapsed": e["elapsed_seconds"]} for e in evaluations]}
        if not trial.params:
            ddp = row
        else:
            rows[key(trial.params)] = row
    return {"configs": rows, "ddp": ddp}


# --- 2. the replay -----------------------------------------------------------------------------
def hypervolume(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by (top-1 up, bytes down) points and bounded by `reference` (top-1 floor, bytes ceiling)."""
    useful = sorted((b, a) for a, b in points if a > reference[0] and b < reference[1])  # by bytes, ascending
    area, best_top1 = 0.0, reference[0]
    for i, (b, a) in enumerate(useful):
        best_top1 = max(best_top1, a)
        next_b = useful[i + 1][0] if i + 1 < len(useful) else reference[1]
        area += (best_top1 - reference[0]) * (next_b - b)
    return area


@dataclass
class Replayed:
    costs: list[float]  # cumulative trial-seconds after each trial
    hypervolumes: list[float]  # of the completed trials after each trial
    pruned: int
    trials: int


def stop_cost(row: dict[str, Any], at: dict[str, Any]) -> float:
    """Wall seconds of a trial stopped at evaluation `at`: the trainer seconds after it are saved."""
    return row["wall_seconds"] - (row["evaluations"][-1]["elapsed"] - at["elapsed"])


def first_exact_step(params: dict[str, Any], steps: int) -> int:
    """The first evaluation step at which AB's predicted bytes are exact: after its first sync."""
    schedule = ABSchedule.from_config(AbConfig(**{k.removeprefix("method."): v for k, v in params.items()}), steps)
    return next(s for s in range(steps + 1) if schedule.syncs_done(s))


def replay(table: dict[str, Any], sampler: str, pruned: bool, seed: int, budget: float, steps: int,
           reference: tuple[float, float], pruner_options: dict[str, Any] | None = None,
           exact_only: bool = True) -> Replayed:
    """`exact_only`: as the trainer predicts, no bytes (so no judgement) before AB's first sync; False: the
    upper bound the first version predicted there (what tables recorded before it hold)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, constant_liar=True),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed)}
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=samplers[sampler]())
    pruner = ParetoAshaPruner(OBJECTIVES, steps, **(pruner_options or {})) if pruned else None
    distributions = {k: CategoricalDistribution(v) for k, v in GRID.items()}
    study.enqueue_trial(PAPER, user_attrs={"reference": "paper-defaults"})
    cost, costs, volumes, pruned_count, complete = 0.0, [], [], 0, []
    while cost < budget:
        trial = study.ask(distributions)
        row = table["configs"][key(trial.params)]
        stopped = None
        exact_from = first_exact_step(trial.params, steps) if exact_only else 0
        evaluations: dict[str, dict[str, float | None]] = {}
        for at in row["evaluations"][:-1]:  # the last is the final evaluation: nothing left to save
            known = at["bytes"] if at["step"] >= exact_from else None
            evaluations[str(at["step"])] = {"top1": at["top1"], "inter_node_bytes": known}
            trial.set_user_attr(EVALUATIONS_ATTR, dict(evaluations))
            if pruner is not None and pruner.prune(study, study._storage.get_trial(trial._trial_id)):
                stopped = at
                break
        if stopped is not None:
            cost += stop_cost(row, stopped)
            study.tell(trial, state=TrialState.PRUNED)
            pruned_count += 1
        else:
            cost += row["wall_seconds"]
            study.tell(trial, [row["top1"], row["bytes"]])
            complete.append((row["top1"], row["bytes"]))
        costs.append(cost)
        volumes.append(hypervolume(complete, reference))
    return Replayed(costs, volumes, pruned_count, len(costs))


def hv_at(run: Replayed, seconds: float) -> float:
    """Hypervolume once `seconds` of trial time were spent (trials finished by then)."""
    reached = [hv for cost, hv in zip(run.costs, run.hypervolumes, strict=True) if cost <= seconds]
    return reached[-1] if reached else 0.0


def seconds_to(run: Replayed, target: float) -> float:
    return next((cost for cost, hv in zip(run.costs, run.hypervolumes, strict=True) if hv >= target), float("inf"))


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile by nearest rank (a seed that never reached a target is inf)."""
    ordered = sorted(values)
    return tuple(ordered[round(q * (len(ordered) - 1))] for q in (0.25, 0.5, 0.75))  # type: ignore[return-value]


def summarize(runs: dict[str, list[Replayed]], budget: float, full_trial: float) -> dict[str, Any]:
    target = quantiles([hv_at(r, budget) for r in runs["tpe"]])[1]  # TPE without pruning, at the budget
    result: dict[str, Any] = {"target_hypervolume": target}
    for arm, arm_runs in runs.items():
        reach = [seconds_to(r, target) / budget for r in arm_runs]
        result[arm] = {
            "hv_at": {f: quantiles([hv_at(r, f * budget) for r in arm_runs]) for f in (0.25, 0.5, 1.0)},
            "fraction_to_target": quantiles(reach),
            "reached_target": sum(x <= 1.0 for x in reach),
            "trials": statistics.median(r.trials for r in arm_runs),
            "pruned": statistics.median(r.pruned for r in arm_runs),
            "seconds_per_trial": statistics.median(r.costs[-1] / r.trials for r in arm_runs),
        }
    result["full_trial_seconds"] = full_trial
    return result


def plot(runs: dict[str, list[Replayed]], budget: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [budget * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    floor = float("inf")  # the paper-defaults trial's hypervolume, once it finished: below it nothing differs
    for arm, arm_runs in runs.items():
        curves = [[hv_at(r, s) for r in arm_runs] for s in grid]
        low, mid, high = ([v / MEGA for v in q] for q in zip(*(quantiles(c) for c in curves), strict=True))
        minutes = [s / 60 for s in grid]
        ax.plot(minutes, mid, label=arm)
        ax.fill_between(minutes, low, high, alpha=0.2)
        floor = min(floor, min(v for v in low if v > 0))
    ax.set_xlabel("cumulative trial time (min)")
    ax.set_ylabel("hypervolume (top-1 x inter-node MB)")
    ax.set_ylim(bottom=floor * 0.98)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- 3. live studies ---------------------------------------------------------------------------
def live(out: Path, table: dict[str, Any], trials: int, steps: int, reference: tuple[float, float]) -> dict[str, Any]:
    results = {}
    for number, arm in enumerate(LIVE_ARMS):
        sampler, pruned = ARMS[arm]
        name = f"live{number}"
        url = f"sqlite:///{out}/live.db"
        before = load()
        abtune("study", "create", str(study_file(out, name, steps, trials, sampler, 0, pruned, False)),
               "--storage", url)
        abtune("study", "run", name, "--storage", url, "--no-tracking")
        finished = optuna.load_study(study_name=name, storage=url).get_trials()
        complete = [t for t in finished if t.state == TrialState.COMPLETE]
        same = [abs(t.values[0] - table["configs"][key(t.params)]["top1"]) < 1e-9
                and abs(t.values[1] - table["configs"][key(t.params)]["bytes"]) < 1e-3 for t in complete]
        results[arm] = {
            "trials": len(finished), "pruned": sum(t.state == TrialState.PRUNED for t in finished),
            "trial_seconds": sum(t.user_attrs.get("wall_seconds", 0.0) for t in finished),
            "hypervolume": hypervolume([(t.values[0], t.values[1]) for t in complete], reference),
            "values_as_in_table": f"{sum(same)}/{len(same)}", "load": f"{before} -> {load()}",
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-mo-pruner"))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget-trials", type=float, default=40, help="budget in full trials' seconds")
    parser.add_argument("--live-trials", type=int, default=16, help="0: no live studies")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--values", type=int, choices=(2, 3), default=3,
                        help="grid values per parameter (2: the first two, 16 configurations, for a quick check)")
    args = parser.parse_args()
    for name in GRID:
        GRID[name] = GRID[name][:args.values]
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    table_path = args.out / "table.json"
    table = json.loads(table_path.read_text()) if table_path.exists() else record_table(args.out, args.steps)
    configs, steps = table["configs"], table["recorded"]["steps"]
    full_trial = statistics.mean(r["wall_seconds"] for r in configs.values())
    budget = args.budget_trials * full_trial
    reference = (min(r["top1"] for r in configs.values()), table["ddp"]["bytes"])
    print(f"table: {len(configs)} configurations, recorded {table['recorded']['date']} on "
          f"{table['recorded']['machine']} in {table['recorded']['seconds'] / 60:.1f} min, load "
          f"{table['recorded']['load_before']} -> {table['recorded']['load_after']}; a full trial "
          f"{full_trial:.1f} s; reference point top-1 {reference[0]:.4f}, {reference[1] / MEGA:.1f} MB (DDP)")

    runs = {arm: [replay(table, sampler, pruned, seed, budget, steps, reference) for seed in range(args.seeds)]
            for arm, (sampler, pruned) in ARMS.items()}
    summary = summarize(runs, budget, full_trial)
    variants = {name: [replay(table, "tpe", True, seed, budget, steps, reference, options, exact)
                       for seed in range(args.seeds)] for name, (options, exact) in VARIANTS.items()}
    summary["variants"] = {name: summarize({"tpe": runs["tpe"], name: v}, budget, full_trial)[name]
                           for name, v in variants.items()}
    title = (f"quickstart grid ({len(configs)} configs), median and quartiles over {args.seeds} sampler seeds;\n"
             f"budget {args.budget_trials:g} full trials; reference point top-1 {reference[0]:.3f}, "
             f"{reference[1] / MEGA:.1f} MB (DDP)")
    plot(runs, budget, args.out / "hypervolume.png", title)
    live_results = live(args.out, table, args.live_trials, steps, reference) if args.live_trials else {}
    (args.out / "results.json").write_text(json.dumps(
        {"summary": summary, "live": live_results, "budget_seconds": budget, "reference": reference,
         "seeds": args.seeds, "recorded": table["recorded"]}, indent=1))
    print_table(summary, live_results, budget)


def print_table(summary: dict[str, Any], live_results: dict[str, Any], budget: float) -> None:
    def q(values: tuple[float, float, float], scale: float = 1.0, digits: int = 2) -> str:
        low, mid, high = (v * scale for v in values)
        return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

    print(f"\ntarget: the median final hypervolume of TPE without pruning, {summary['target_hypervolume'] / MEGA:.3f} "
          f"(top-1 x MB), budget {budget / 60:.1f} min of trial time")
    print("| arm | trial time to target / budget | seeds reaching it | HV at 25% | HV at 50% | HV at 100% "
          "| trials | pruned | s per trial |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        s = summary[arm]
        hv = [q(s["hv_at"][f], 1 / MEGA, 3) for f in (0.25, 0.5, 1.0)]
        print(f"| {arm} | {q(s['fraction_to_target'])} | {s['reached_target']} | {' | '.join(hv)} "
              f"| {s['trials']:.0f} | {s['pruned']:.0f} | {s['seconds_per_trial']:.1f} |")
    print("\n| pareto-asha setting (TPE) | trial time to target / budget | seeds reaching it | HV at 50% "
          "| HV at 100% | trials | pruned |")
    print("|---|---|---|---|---|---|---|")
    for name, s in summary["variants"].items():
        print(f"| {name} | {q(s['fraction_to_target'])} | {s['reached_target']} | "
              f"{q(s['hv_at'][0.5], 1 / MEGA, 3)} | {q(s['hv_at'][1.0], 1 / MEGA, 3)} | {s['trials']:.0f} "
              f"| {s['pruned']:.0f} |")
    if live_results:
        print("\n| live study (seed 0) | trials | pruned | trial s | HV | values as in the table | load |")
        print("|---|---|---|---|---|---|---|")
        for arm, r in live_results.items():
            print(f"| {arm} | {r['trials']} | {r['pruned']} | {r['trial_seconds']:.0f} | "
                  f"{r['hypervolume'] / MEGA:.3f} | {r['values_as_in_table']} | {r['load']} |")


if __name__ == "__main__":
    main()
