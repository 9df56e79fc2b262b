"""A run folder: the resolved config.yaml every rank reads, written by one code path.

`abtune train` and every study trial prepare their folders here, so a trial folder can be
resumed or re-run with `abtune train` like any other run.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from abtune.config import RunConfig, flatten, load_run_config
from abtune.errors import ConfigError
from abtune.runfiles import CONFIG_FILE, FAILURES_DIR
from abtune.runlock import claim_run

DEFAULT_RUNS_DIR = Path("runs")


def default_run_dir(config: RunConfig) -> Path:
    return DEFAULT_RUNS_DIR / f"{config.name}-{config.method.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(config: RunConfig, run_dir: Path | None, resume: bool, claim: bool = False) -> Path:
    """The run folder with its config.yaml; `claim`: this process launches the run and holds it (runlock)."""
    if run_dir is None:
        if resume:
            raise ConfigError("--resume needs --run-dir: the folder of the run to continue")
        run_dir = default_run_dir(config)
    stored = run_dir / CONFIG_FILE
    if resume:
        check_same_config(stored, config)
    elif stored.exists():
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    if claim:
        claim_run(run_dir)  # refuses while an earlier launch of this run still trains
    stored.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    shutil.rmtree(run_dir / FAILURES_DIR, ignore_errors=True)
    return run_dir


def check_same_config(stored: Path, config: RunConfig) -> None:
    if not stored.exists():
        raise ConfigError(f"{stored.parent} holds no run to resume (no {CONFIG_FILE})")
    before = flatten(load_run_config(stored))
    after = flatten(config)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        raise ConfigError(
            f"the config differs from the run being resumed in {', '.join(changed)}; "
            "resume with the same config or start a new --run-dir"
        )
