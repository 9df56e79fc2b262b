"""Warm start across scales: trials a study needs to reach the front of a cold one.

    python benchmarks/bench_warm_start.py [--out runs/bench-warm-start] [--steps 100] [--trials 6]

Three real studies of the quickstart run config (studies/quickstart.yaml, `train.steps` set to --steps),
one after another, each with --trials trials (the two reference trials included), in OUT's own SQLite
storage, untracked:

1. OLD: 4 ranks as 2 nodes (the quickstart's layout);
2. COLD: 4 ranks as 4 nodes (another scale: every all-reduce crosses nodes), sampler seed 1;
3. WARM: COLD's definition created with `--warm-start OLD`: OLD's front enqueued first.

For COLD and WARM: after each trial in the order they ran, whether a search trial so far reaches COLD's
final Pareto front (no trial of that front dominates it, on top-1 and inter-node MB), and the recommendation
each study ends with against its DDP reference. Writes OUT/results.json and a markdown table on stdout;
the load average before and after each study.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import yaml

from abtune.objectives import dominates
from abtune.study import recommendation, results

REPO = Path(__file__).resolve().parent.parent


def _study_file(out: Path, name: str, steps: int, trials: int, per_node: int, seed: int) -> Path:
    spec = yaml.safe_load((REPO / "studies" / "quickstart.yaml").read_text())
    spec.update(name=name, base=str(REPO / "studies" / spec["base"]), overrides={"train.steps": steps},
                layout={"nproc": 4, "ranks_per_node": per_node}, trials=trials, study_dir=str(out / name))
    spec["sampler"] = {**spec["sampler"], "seed": seed}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _abtune(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "abtune.cli", *args], cwd=cwd, check=True)


def _run(out: Path, url: str, path: Path, name: str, *create: str) -> dict[str, Any]:
    load = os.getloadavg()[0]
    _abtune("study", "create", str(path), "--storage", url, *create, cwd=out)
    _abtune("study", "run", name, "--storage", url, "--no-tracking", cwd=out)
    return {"load_before": load, "load_after": os.getloadavg()[0]}


def _scores(trial: optuna.trial.FrozenTrial) -> list[float]:
    return [trial.user_attrs["top1"], -trial.user_attrs["inter_node_bytes"]]


def _reached(trials: list[optuna.trial.FrozenTrial], front: list[optuna.trial.FrozenTrial]) -> list[bool]:
    """After each trial (in the order they finished): a search trial so far that no trial of `front` dominates."""
    done = sorted(trials, key=lambda t: t.datetime_complete or t.datetime_start)
    reached, found = [], False
    for trial in done:
        if trial in results.search_trials([trial]) and not any(dominates(_scores(f), _scores(trial)) for f in front):
            found = True
        reached.append(found)
    return reached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-warm-start"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{out / 'optuna.db'}"
    loads = {"old": _run(out, url, _study_file(out, "old", args.steps, args.trials, 2, 0), "old"),
             "cold": _run(out, url, _study_file(out, "cold", args.steps, args.trials, 1, 1), "cold")}
    loads["warm"] = _run(out, url, _study_file(out, "warm", args.steps, args.trials, 1, 1), "warm", "--warm-start", "old")
    trials = {n: optuna.load_study(study_name=n, storage=url).get_trials(deepcopy=False) for n in ("cold", "warm")}
    front = results.pareto_front(results.search_trials(trials["cold"]), ["top1", "inter_node_bytes"])
    report: dict[str, Any] = {"steps": args.steps, "trials": args.trials, "loads": loads,
                              "cold_front": [t.number for t in front]}
    for name, study_trials in trials.items():
        reached = _reached(study_trials, front)
        answer = recommendation.current(optuna.load_study(study_name=name, storage=url))
        report[name] = {"reached_after": next((i + 1 for i, r in enumerate(reached) if r), None),
                        "order": [(t.number, t.user_attrs.get("reference") or t.user_attrs.get("warm_start_of") or "")
                                  for t in sorted(study_trials, key=lambda t: t.number)],
                        "recommendation": answer.lines() if answer else None}
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("| study | trials to reach COLD's final front | recommendation |\n| --- | --- | --- |")
    for name in ("cold", "warm"):
        print(f"| {name} | {report[name]['reached_after']} of {len(trials[name])} | "
              f"{'; '.join(report[name]['recommendation'] or [])} |")
    print(json.dumps(loads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
