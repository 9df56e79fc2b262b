"""Rank 0's window into a run while it trains.

Every run writes `metrics.jsonl` (one JSON object per line: `kind` is `log`, `evaluation` or
`summary`). Other parts of abtune watch a run through hooks named in `RUN_DIR/hooks.yaml`, written by
the process that starts the run from the factory itself (`hook_spec(make_hook, study=...)`), so the
layer that owns a hook is the one that names it; rank 0 only loads what the file names::

    - factory: abtune.study.pruning:make_hook     # module:callable returning a TrainingHook
      options: {study: quickstart, trial: 3}      # keyword arguments; never secrets
      may_stop: true                              # default; false: never stops the run (a tracker),
                                                  # so no stop decision is broadcast at evaluations

Hooks run on rank 0 only. Secrets (a storage password) reach a hook through the environment,
never through this file. An evaluation hook may ask the run to stop early (pruning); rank 0
broadcasts that decision so every rank stops at the same step.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from abtune.errors import ConfigError
from abtune.runfiles import HOOKS_FILE, METRICS_FILE
from abtune.yamlfile import read_yaml


class TrainingHook:
    """Override what you need; every method is called on rank 0 only."""

    def on_log(self, record: dict[str, Any]) -> None:
        """Every `train.log_every` steps: step, loss, lr, phase, step_seconds, cumulative bytes."""

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        """After each evaluation; return a reason to stop the run early (e.g. "pruned"), or None."""
        return None

    def on_end(self, summary: dict[str, Any]) -> None:
        """Once, with the run's summary (also written to summary.json)."""

    def close(self) -> None:
        """Release resources; called even when the run fails."""


class MetricsFile(TrainingHook):
    """Appends every record to RUN_DIR/metrics.jsonl; a resumed run first drops records past its checkpoint."""

    def __init__(self, run_dir: Path, resumed_at: int | None) -> None:
        self.path = run_dir / METRICS_FILE
        if resumed_at is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= resumed_at]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resumed_at is None:
            self.path.write_text("")

    def _append(self, kind: str, record: dict[str, Any]) -> None:
        with self.path.open("a") as stream:
            stream.write(json.dumps({"kind": kind, **record}, default=str) + "\n")

    def on_log(self, record: dict[str, Any]) -> None:
        self._append("log", record)

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        self._append("evaluation", row)
        return None

    def on_end(self, summary: dict[str, Any]) -> None:
        self._append("summary", {"step": summary["steps_done"], "best_top1": summary["best_top1"],
                                 **{f"final_{k}": v for k, v in summary["final"].items()}})


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluation_rows(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's evaluation records by step."""
    return {int(r["step"]): r for r in read_metrics(run_dir) if r.get("kind") == "evaluation"}



def _step_of(line: str) -> float:
    try:
        return float(json.loads(line).get("step", math.inf))
    except json.JSONDecodeError:
        return math.inf  # a line cut short by a crash


def write_hook_specs(run_dir: Path, specs: list[dict[str, Any]]) -> None:
    (run_dir / HOOKS_FILE).write_text(yaml.safe_dump(specs, sort_keys=False))


def configured_hook_specs(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / HOOKS_FILE
    if not path.exists():
        return []
    specs = read_yaml(path, expected=list)
    if not isinstance(specs, list) or not all(isinstance(s, dict) and "factory" in s for s in specs):
        raise ConfigError(f"{path}: expected a list of {{factory: module:callable, options: {{...}}}}")
    return specs


def hook_spec(factory: Callable[..., TrainingHook], **options: Any) -> dict[str, Any]:
    """The hooks.yaml entry of a module-level factory with its keyword options (plain values, never secrets)."""
    return {"factory": f"{factory.__module__}:{factory.__qualname__}", "options": options}


def load_factory(spec: dict[str, Any], run_dir: Path) -> Callable[..., TrainingHook]:
    module_name, _, attribute = str(spec["factory"]).partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"{run_dir / HOOKS_FILE}: cannot load hook {spec['factory']!r}: {error}") from None


def build_hooks(run_dir: Path, specs: list[dict[str, Any]]) -> list[TrainingHook]:
    return [load_factory(spec, run_dir)(run_dir=run_dir, **(spec.get("options") or {})) for spec in specs]
