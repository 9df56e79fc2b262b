"""A run folder: the resolved config.yaml every rank reads, written by one code path.

`abtune train` and every study trial prepare their folders here, so a trial folder can be
resumed or re-run with `abtune train` like any other run.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from abtune.config import RunConfig, flatten, load_run_config
from abtune.errors import ConfigError
from abtune.runfiles import CONFIG_FILE, FAILURES_DIR, check_checkpoint_layout, latest_checkpoint_step
from abtune.runlock import check_idle, claim_run

DEFAULT_RUNS_DIR = Path("runs")
CHOOSE_ANOTHER = "choose a folder you can write"


class UnwritableFolder(ConfigError):
    """A folder abtune must write cannot be made or written (read-only, under a file, no space, /proc)."""


def check_writable(folder: Path, name: str) -> None:
    """Refuse in one line, before anything starts, a folder that cannot be made or written; `name` says
    where it came from (`--run-dir`, `study_dir`). Leaves nothing behind: the probe is removed."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise UnwritableFolder(f"{name} {folder}: {existing} is a file, not a folder; {CHOOSE_ANOTHER}")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".abtune-probe-", dir=existing))
    except OSError as error:
        raise UnwritableFolder(f"{name} {folder}: cannot create a folder in {existing} ({_reason(error)}); "
                               f"{CHOOSE_ANOTHER}") from None


@contextlib.contextmanager
def writing(folder: Path, name: str) -> Iterator[None]:
    """An OSError in the block (making the folder, a file in it) becomes UnwritableFolder, one line."""
    try:
        yield
    except OSError as error:
        raise UnwritableFolder(f"{name} {folder}: cannot write {error.filename or 'there'} ({_reason(error)}); "
                               f"{CHOOSE_ANOTHER}") from None


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


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
    else:
        check_no_run_in(run_dir)
    with writing(run_dir, "run folder"):
        run_dir.mkdir(parents=True, exist_ok=True)
        if claim:
            claim_run(run_dir)  # refuses while an earlier launch of this run still trains
        stored.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    shutil.rmtree(run_dir / FAILURES_DIR, ignore_errors=True)
    return run_dir


def check_no_run_in(run_dir: Path) -> None:
    """A new run's folder must not hold another run (its config.yaml)."""
    if (run_dir / CONFIG_FILE).exists():
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")


def check_resumable(run_dir: Path, config: RunConfig, nodes: int, ranks_per_node: int) -> None:
    """`--resume`: the folder holds this run (same config) and a checkpoint to continue from, written on this
    layout; a run that stopped before its first checkpoint would only start again at step 0 over its earlier
    records."""
    check_same_config(run_dir / CONFIG_FILE, config)
    check_idle(run_dir)  # a run still training has no checkpoint yet, maybe: that is not what to say
    if latest_checkpoint_step(run_dir) is None:
        raise ConfigError(f"--resume: {run_dir} holds no checkpoint to resume from (the run stopped before "
                          "train.checkpoint_every wrote one); start it again without --resume in another --run-dir")
    check_checkpoint_layout(run_dir, nodes, ranks_per_node)


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
